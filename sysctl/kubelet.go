package sysctl

import "fmt"

// kubeletDefaults keeps the kubelet's defaults podgate can verify: parsable names of the
// network and IPC namespaces. The rest (user.*, kernel.domainname) the kubelet applies alone.
func kubeletDefaults(in map[string]string) map[Name]string {
	out := map[Name]string{}
	for _, k := range sortedKeys(in) {
		n, err := ParseName(k)
		if err != nil {
			continue // the kubelet validates its own configuration
		}
		if ns := podNamespace(n); ns == NetNamespace || ns == IPCNamespace {
			out[n] = in[k]
		}
	}
	return out
}

// Conflict is a default sysctl that both podgate's configuration and the kubelet's
// defaultPodSysctls set, to different values: the kubelet's wins (Config.KubeletDefaults).
type Conflict struct {
	// Name is the sysctl, normalised (dots).
	Name Name
	// Field is podgate's configuration key that sets it: sysctls.podDefaults or
	// sysctls.namespaceDefaults.<namespace>.
	Field string
	// Podgate and Kubelet are the two values.
	Podgate, Kubelet string
}

// String is the conflict as one line of check-config.
func (c Conflict) String() string {
	return fmt.Sprintf("sysctl %s: %s sets %q, the kubelet's defaultPodSysctls %q: the kubelet's value wins", c.Name, c.Field, c.Podgate, c.Kubelet)
}

// KeysAndValues are the conflict as a log line's key/value pairs.
func (c Conflict) KeysAndValues() []any {
	return []any{"sysctl", string(c.Name), "field", c.Field, "podgate", c.Podgate, "kubelet", c.Kubelet, "winner", "kubelet"}
}

// DefaultConflicts lists the defaults of cfg's PodDefaults and NamespaceDefaults that its
// KubeletDefaults set to another value (compared as the verification compares a value read
// back, so that "1024 65535" and "1024\t65535" agree): podDefaults first, then each namespace's,
// by name. Names are
// compared normalised: net/ipv4/ip_forward is net.ipv4.ip_forward.
func DefaultConflicts(cfg Config) []Conflict {
	kubelet := map[Name]string{}
	for k, v := range cfg.KubeletDefaults {
		if n, err := ParseName(k); err == nil {
			kubelet[n] = v
		}
	}
	var out []Conflict
	check := func(field string, defaults map[string]string) {
		for _, k := range sortedKeys(defaults) {
			n, err := ParseName(k)
			if err != nil {
				continue // NewPolicy refuses it
			}
			if kv, set := kubelet[n]; set && !SameValue(n, defaults[k], kv) {
				out = append(out, Conflict{Name: n, Field: field, Podgate: defaults[k], Kubelet: kv})
			}
		}
	}
	check("sysctls.podDefaults", cfg.PodDefaults)
	for _, ns := range sortedKeys(cfg.NamespaceDefaults) {
		check("sysctls.namespaceDefaults."+ns, cfg.NamespaceDefaults[ns])
	}
	return out
}

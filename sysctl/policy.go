package sysctl

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
)

// Config is the operator's sysctl policy (the sysctls section of podgate's configuration).
type Config struct {
	// PodDefaults are added to every pod that does not set them.
	PodDefaults map[string]string
	// NamespaceDefaults are added to the pods of one Kubernetes namespace; they win over
	// PodDefaults.
	NamespaceDefaults map[string]map[string]string
	// KubeletDefaults are the kubelet's own defaults (its defaultPodSysctls), given only where
	// the kubelet applies them (its DefaultPodSysctls gate on). The kubelet merges them into
	// RunPodSandbox's sysctls, where podgate cannot tell them from the pod's own: so they win
	// over PodDefaults and NamespaceDefaults (the pod's own values win over all), and one the
	// request lacks is added with the kubelet's value, so that the verification reads back every
	// default the pod does not override. Names outside the network and IPC namespaces, which
	// podgate does not handle, are left to the kubelet.
	KubeletDefaults map[string]string
	// AllowedUnsafe are names, or prefixes ending in "*", that pods may set beyond the safe set.
	// Empty, the policy trusts the caller's (the kubelet's) admission of a pod's unsafe
	// namespaced sysctls; set, it enforces this list too. Node defaults must be safe or in it
	// either way.
	AllowedUnsafe []string
}

// Policy decides which sysctls a pod may set and completes them with node defaults.
type Policy struct {
	kernel KernelVersion
	// enforceUnsafe: the operator set an allowlist, so pods' unsafe sysctls must match it too.
	enforceUnsafe bool
	unsafeExact   map[Name]bool
	unsafePrefix  []string
	podDefaults   map[Name]string
	nsDefaults    map[string]map[Name]string
	// kubeletDefaults are Config.KubeletDefaults of the namespaces podgate handles.
	kubeletDefaults map[Name]string
}

// NewPolicy validates the operator's configuration against the running kernel (kernel) and the
// node's sysctl tree (procSys, normally /proc/sys). Every error names the configuration field.
func NewPolicy(cfg Config, kernel KernelVersion, procSys string) (*Policy, error) {
	p := &Policy{
		kernel:        kernel,
		enforceUnsafe: len(cfg.AllowedUnsafe) > 0,
		unsafeExact:   map[Name]bool{},
		podDefaults:   map[Name]string{},
		nsDefaults:    map[string]map[Name]string{},
	}
	var errs []error
	for i, pat := range cfg.AllowedUnsafe {
		if err := p.addUnsafe(pat, procSys); err != nil {
			errs = append(errs, fmt.Errorf("sysctls.allowedUnsafe[%d] %q: %w", i, pat, err))
		}
	}
	// Defaults are checked like a pod's own sysctls, for an ordinary pod, but always against
	// the allowlist: no kubelet admitted them, they are podgate's own.
	check := func(field string, in map[string]string) map[Name]string {
		out := map[Name]string{}
		for _, k := range sortedKeys(in) {
			n, err := p.allowed(k, in[k], Pod{}, true)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", field, err))
				continue
			}
			out[n] = in[k]
		}
		return out
	}
	p.podDefaults = check("sysctls.podDefaults", cfg.PodDefaults)
	for _, ns := range sortedKeys(cfg.NamespaceDefaults) {
		if ns == "" {
			errs = append(errs, errors.New("sysctls.namespaceDefaults: empty namespace name"))
			continue
		}
		p.nsDefaults[ns] = check("sysctls.namespaceDefaults."+ns, cfg.NamespaceDefaults[ns])
	}
	p.kubeletDefaults = kubeletDefaults(cfg.KubeletDefaults)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

// addUnsafe validates one allowlist entry: a name or a prefix ending in "*", inside a namespace
// pods own, and known to this node's kernel.
func (p *Policy) addUnsafe(pat, procSys string) error {
	prefix, wildcard := strings.CutSuffix(pat, "*")
	if strings.Contains(prefix, "*") {
		return errors.New(`"*" is allowed only at the end`)
	}
	// Classified as the kubelet classifies its own allowlist, so that podgate accepts the
	// entries the kubelet accepts, and no other.
	switch ns := patternNamespace(prefix); ns {
	case NoNamespace:
		return errors.New("not a namespaced sysctl (net.*, kernel.shm*, kernel.msg*, kernel.sem, fs.mqueue.*): pods cannot set it without changing the node")
	case UTSNamespace, UserNamespace:
		return errors.New(unhandledNamespace(ns))
	}
	if !wildcard {
		n, err := ParseName(pat)
		if err != nil {
			return err
		}
		if !known(n, procSys) {
			return fmt.Errorf("no such sysctl on this node (%s)", procSys)
		}
		p.unsafeExact[n] = true
		return nil
	}
	prefix = Normalize(prefix)
	if !knownPrefix(prefix, procSys) {
		return fmt.Errorf("no sysctl on this node starts with %q", prefix)
	}
	p.unsafePrefix = append(p.unsafePrefix, prefix)
	return nil
}

// Pod is what the policy needs to know of a pod.
type Pod struct {
	// Namespace is the pod's Kubernetes namespace, for namespaceDefaults.
	Namespace string
	// HostNetwork and HostIPC: the pod shares the node's network or IPC namespace, so sysctls
	// of that namespace would change the node.
	HostNetwork, HostIPC bool
}

// RejectedError is a pod sysctl the policy refuses. It is an [errdefs.ErrInvalidArgument],
// which the CRI boundary turns into InvalidArgument for the kubelet.
type RejectedError struct {
	Sysctl string
	Reason string
}

func (e *RejectedError) Error() string { return fmt.Sprintf("sysctl %q: %s", e.Sysctl, e.Reason) }

// Unwrap returns the refusal's class, errdefs.ErrInvalidArgument: the pod asked for something
// the policy never allows, so retrying the same request cannot succeed.
func (e *RejectedError) Unwrap() error { return errdefs.ErrInvalidArgument }

// unhandledNamespace is why podgate refuses a sysctl of a namespace the kubelet knows but
// podgate does not enter: it could neither check nor verify it there.
func unhandledNamespace(ns Namespace) string {
	return fmt.Sprintf("a sysctl of the %s namespace: podgate handles only network and IPC sysctls", ns)
}

// allowed checks one sysctl against the policy and returns its normalised name. An unsafe
// sysctl must match the allowlist only when enforceUnsafe; otherwise the caller admitted it
// (the kubelet checks its own allowedUnsafeSysctls), and a namespaced sysctl of a namespace the
// pod owns cannot reach the node.
func (p *Policy) allowed(name, value string, pod Pod, enforceUnsafe bool) (Name, error) {
	reject := func(format string, args ...any) (Name, error) {
		return "", &RejectedError{Sysctl: name, Reason: fmt.Sprintf(format, args...)}
	}
	n, err := ParseName(name)
	if err != nil {
		return reject("%v", err)
	}
	switch ns := podNamespace(n); ns {
	case NoNamespace:
		return reject("not namespaced: it would change the whole node")
	case UTSNamespace, UserNamespace:
		return reject("%s", unhandledNamespace(ns))
	case NetNamespace:
		if pod.HostNetwork {
			return reject("the pod uses the host's network namespace")
		}
	case IPCNamespace:
		if pod.HostIPC {
			return reject("the pod uses the host's IPC namespace")
		}
	}
	if minKernel, safe := safeSysctls[n]; safe {
		if !p.kernel.AtLeast(minKernel) {
			return reject("namespaced only from kernel %s, this node runs %s", minKernel, p.kernel)
		}
	} else if enforceUnsafe && !p.unsafeAllowed(n) {
		return reject("unsafe and not in sysctls.allowedUnsafe")
	}
	if err := CheckValue(n, value); err != nil {
		return reject("value: %v", err)
	}
	return n, nil
}

func (p *Policy) unsafeAllowed(n Name) bool {
	if p.unsafeExact[n] {
		return true
	}
	for _, pre := range p.unsafePrefix {
		if strings.HasPrefix(string(n), pre) {
			return true
		}
	}
	return false
}

// Complete checks a pod's sysctls and returns them with the node's defaults added for what the
// pod does not set (its own values win, then the kubelet's defaults, the namespace's, the
// node's; net.* defaults skip host-network pods, IPC ones host-IPC pods). added lists the defaults it added. The pod's own keys are kept as written.
// A pod's unsafe sysctls must match the allowlist only when the configuration has one. The
// first refused sysctl is returned as a *RejectedError.
func (p *Policy) Complete(pod Pod, sysctls map[string]string) (out map[string]string, added []Name, err error) {
	values := make(map[Name]string, len(sysctls))
	spelling := make(map[Name]string, len(sysctls))
	for _, k := range sortedKeys(sysctls) {
		n, err := p.allowed(k, sysctls[k], pod, p.enforceUnsafe)
		if err != nil {
			return nil, nil, err
		}
		if other, dup := spelling[n]; dup {
			return nil, nil, &RejectedError{Sysctl: k, Reason: fmt.Sprintf("set twice, also as %q", other)}
		}
		values[n], spelling[n] = sysctls[k], k
	}
	out = make(map[string]string, len(sysctls))
	for k, v := range sysctls {
		out[k] = v
	}
	add := func(defaults map[Name]string) {
		for _, n := range sortedKeys(defaults) {
			if _, set := values[n]; set || (pod.HostNetwork && podNamespace(n) == NetNamespace) || (pod.HostIPC && podNamespace(n) == IPCNamespace) {
				continue
			}
			values[n] = defaults[n]
			out[string(n)] = defaults[n]
			added = append(added, n)
		}
	}
	add(p.kubeletDefaults)           // the kubelet's, normally in the request already, win over podgate's
	add(p.nsDefaults[pod.Namespace]) // the namespace's defaults win over the node-wide ones
	add(p.podDefaults)
	if err := checkPortRange(values, spelling); err != nil {
		return nil, nil, err
	}
	return out, added, nil
}

// Defaults of a new network namespace, for checks across sysctls.
const (
	defaultLocalPortRangeLow          = 32768
	defaultUnprivilegedPortStart      = 1024
	localPortRange               Name = "net.ipv4.ip_local_port_range"
	unprivilegedPortStart        Name = "net.ipv4.ip_unprivileged_port_start"
)

// checkPortRange applies the kernel's rule between two sysctls: the local port range must not
// reach below the first unprivileged port, or the kernel refuses whichever is written second.
func checkPortRange(values map[Name]string, spelling map[Name]string) error {
	rng, setRange := values[localPortRange]
	start, setStart := values[unprivilegedPortStart]
	if !setRange && !setStart {
		return nil
	}
	low, unpriv := int64(defaultLocalPortRangeLow), int64(defaultUnprivilegedPortStart)
	if setRange {
		low, _ = strconv.ParseInt(strings.Fields(rng)[0], 10, 64) // CheckValue accepted it
	}
	if setStart {
		unpriv, _ = strconv.ParseInt(start, 10, 64)
	}
	if low >= unpriv {
		return nil
	}
	name := spelling[localPortRange]
	if name == "" {
		name = string(localPortRange)
	}
	return &RejectedError{Sysctl: name, Reason: fmt.Sprintf(
		"local port range starts at %d, below net.ipv4.ip_unprivileged_port_start %d: the kernel refuses it", low, unpriv)}
}

// known reports whether n exists in the node's sysctl tree. A per-interface name
// (net.ipv4.conf.eth0.rp_filter) names an interface of the pod, not of the node: it is checked
// for the "default" interface instead.
func known(n Name, procSys string) bool {
	path, err := perInterfaceTemplate(n).Path(procSys)
	if err != nil {
		return false
	}
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir()
}

func knownPrefix(prefix, procSys string) bool {
	// "net.ipv4.tcp_" lists /proc/sys/net/ipv4 for entries starting with "tcp_".
	dir, leaf := "", prefix
	if i := strings.LastIndexByte(prefix, '.'); i >= 0 {
		dir, leaf = prefix[:i], prefix[i+1:]
	}
	root := procSys
	if dir != "" {
		p, err := perInterfaceTemplate(Name(dir)).Path(procSys)
		if err != nil {
			return false
		}
		root = p
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return false
	}
	return slices.ContainsFunc(entries, func(e os.DirEntry) bool {
		return strings.HasPrefix(e.Name(), strings.ReplaceAll(leaf, "/", "."))
	})
}

// perInterfaceTemplate maps net.{ipv4,ipv6}.{conf,neigh}.<interface>.x to the "default"
// interface's entry, which every network namespace has.
func perInterfaceTemplate(n Name) Name {
	parts := strings.Split(string(n), ".")
	if len(parts) >= 4 && parts[0] == "net" && (parts[1] == "ipv4" || parts[1] == "ipv6") && (parts[2] == "conf" || parts[2] == "neigh") {
		parts[3] = "default"
	}
	return Name(strings.Join(parts, "."))
}

func sortedKeys[K ~string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

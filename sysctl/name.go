package sysctl

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"

	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
)

// ProcSys is the root of the sysctl tree.
const ProcSys = "/proc/sys"

// maxNameLen is the longest sysctl name accepted: the Kubernetes API's limit for a sysctl name
// (a DNS subdomain's 253 characters).
const maxNameLen = 253

// nameRE matches a sysctl name as the Kubernetes API validates it: components of lower-case
// letters, digits, '-' and '_', starting and ending with a letter or digit,
// joined by '.' (a level of /proc/sys) or '/' (a '.' inside a level, e.g. a VLAN interface
// "eth0.100" written "net.ipv4.conf.eth0/100.rp_filter").
var nameRE = regexp.MustCompile(`^[a-z0-9]([-_a-z0-9]*[a-z0-9])?([./][a-z0-9]([-_a-z0-9]*[a-z0-9])?)*$`)

// Name is a validated sysctl name in dotted form ("net.ipv4.tcp_keepalive_time").
type Name string

// Normalize converts a name to dotted form with the kubelet's own function: a name whose first
// separator is '/' ("net/ipv4/conf/eth0.100/rp_filter") has its '.' and '/' swapped.
func Normalize(name string) string { return utilsysctl.NormalizeName(name) }

// ParseName normalises and validates a sysctl name. Malformed names (empty components, "..",
// characters sysctl names do not use, absurd length) are errors.
func ParseName(name string) (Name, error) {
	if name == "" {
		return "", fmt.Errorf("empty name")
	}
	if len(name) > maxNameLen {
		return "", fmt.Errorf("name is %d bytes, at most %d", len(name), maxNameLen)
	}
	n := Normalize(name)
	if !nameRE.MatchString(n) {
		return "", fmt.Errorf("malformed name: want dot-separated components of a-z, 0-9, '-' and '_'")
	}
	return Name(n), nil
}

// Path is the name's file under root (normally ProcSys): each '.' is a directory level and a
// '/' is a '.' within a level. For a name from ParseName the result always lies inside root;
// Path checks that again rather than trust its caller.
func (n Name) Path(root string) (string, error) {
	parts := strings.Split(string(n), ".")
	for i, p := range parts {
		p = strings.ReplaceAll(p, "/", ".")
		if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "/\x00") {
			return "", fmt.Errorf("sysctl %q: component %q cannot be a path element", string(n), p)
		}
		parts[i] = p
	}
	path := filepath.Join(append([]string{root}, parts...)...)
	if rel, err := filepath.Rel(root, path); err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("sysctl %q: path %s outside %s", string(n), path, root)
	}
	return path, nil
}

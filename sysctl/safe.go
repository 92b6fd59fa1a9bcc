package sysctl

// safeSysctls is the kubelet's safe set: sysctls namespaced by the kernel, isolated between pods
// and unable to harm the node, each with the kernel version from which it is namespaced, written
// as the kubelet writes it (zero: every kernel a node runs). A pod may set them without the
// operator's say-so; on an older kernel they are refused, since they would change the node, not
// the pod.
var safeSysctls = map[Name]KernelVersion{
	"kernel.shm_rmid_forced":              {},
	"net.ipv4.ip_local_port_range":        {},
	"net.ipv4.tcp_syncookies":             {},
	"net.ipv4.ping_group_range":           {},
	"net.ipv4.ip_unprivileged_port_start": {},
	"net.ipv4.ip_local_reserved_ports":    mustKernel("3.16"),
	"net.ipv4.tcp_keepalive_time":         mustKernel("4.5"),
	"net.ipv4.tcp_keepalive_intvl":        mustKernel("4.5"),
	"net.ipv4.tcp_keepalive_probes":       mustKernel("4.5"),
	"net.ipv4.tcp_fin_timeout":            mustKernel("4.6"),
	"net.ipv4.tcp_notsent_lowat":          mustKernel("4.6"),
	"net.ipv4.tcp_rmem":                   mustKernel("4.15"),
	"net.ipv4.tcp_wmem":                   mustKernel("4.15"),
	"net.ipv4.tcp_slow_start_after_idle":  mustKernel("4.15"),
}

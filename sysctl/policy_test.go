package sysctl

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

// fakeProcSys makes a small sysctl tree for allowlist checks.
func fakeProcSys(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range []string{
		"net/core/somaxconn", "net/ipv4/tcp_keepalive_time", "net/ipv4/tcp_max_syn_backlog",
		"net/ipv4/conf/default/rp_filter", "net/ipv4/conf/all/rp_filter", "kernel/shmmax", "kernel/msgmax",
		"kernel/core_pattern", "fs/mqueue/msg_max", "kernel/shm_next_id", "kernel/sem_next_id",
		"kernel/domainname", "user/max_user_namespaces",
	} {
		p := filepath.Join(root, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

var modern = KernelVersion{6, 18}

func TestAllowlistPatterns(t *testing.T) {
	root := fakeProcSys(t)
	for _, tc := range []struct {
		pattern string
		ok      bool
		why     string
	}{
		{"net.core.somaxconn", true, ""},
		{"net.ipv4.conf.*", true, ""},
		{"net.ipv4.conf.eth0.rp_filter", true, ""}, // per-interface: checked against "default"
		{"net.ipv4.tcp_*", true, ""},
		{"kernel.shm*", true, ""},
		{"fs.mqueue.*", true, ""},
		{"kernel.core_pattern", false, "not a namespaced sysctl"},
		{"kernel.*", false, "not a namespaced sysctl"},
		{"*", false, "not a namespaced sysctl"},
		{"vm.swappiness", false, "not a namespaced sysctl"},
		{"net.core.no_such_thing", false, "no such sysctl"},
		{"net.nosuch*", false, "no sysctl on this node starts with"},
		{"net.*.rp_filter", false, `"*" is allowed only at the end`},
		{"net.ipv4..x", false, "malformed"},
		// The kubelet refuses these in --allowed-unsafe-sysctls: its library lists no such
		// IPC sysctl (kernel.shm_next_id is IPC, but only a "kernel.shm*" entry says so).
		{"kernel.shm_next_id", false, "not a namespaced sysctl"},
		{"kernel.shm_*", false, "not a namespaced sysctl"},
		{"kernel.sem*", true, ""},
		// The kubelet accepts these; podgate enters no UTS or user namespace to check them.
		{"kernel.domainname", false, "podgate handles only network and IPC sysctls"},
		{"user.*", false, "podgate handles only network and IPC sysctls"},
	} {
		_, err := NewPolicy(Config{AllowedUnsafe: []string{tc.pattern}}, modern, root)
		if tc.ok && err != nil {
			t.Errorf("pattern %q: %v", tc.pattern, err)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), tc.why) || !strings.Contains(err.Error(), "sysctls.allowedUnsafe[0]")) {
			t.Errorf("pattern %q: got %v, want an error naming the field and %q", tc.pattern, err, tc.why)
		}
	}
}

// TestCompleteChecksPodSysctls runs with an allowlist set, so podgate enforces it.
func TestCompleteChecksPodSysctls(t *testing.T) {
	root := fakeProcSys(t)
	p, err := NewPolicy(Config{AllowedUnsafe: []string{"net.core.somaxconn", "net.ipv4.conf.*", "kernel.msg*"}}, modern, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		sysctls  map[string]string
		pod      Pod
		rejected string // the sysctl named in the error, "" = accepted
		why      string
	}{
		{"safe", map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Pod{}, "", ""},
		{"safe in slash form", map[string]string{"net/ipv4/ip_local_port_range": "1024 65000"}, Pod{}, "", ""},
		{"allowed unsafe", map[string]string{"net.core.somaxconn": "4096", "net.ipv4.conf.eth0/100.rp_filter": "2"}, Pod{}, "", ""},
		{"ipc safe", map[string]string{"kernel.shm_rmid_forced": "1"}, Pod{}, "", ""},
		{"unsafe not allowed", map[string]string{"net.ipv4.tcp_max_syn_backlog": "1024"}, Pod{}, "net.ipv4.tcp_max_syn_backlog", "not in sysctls.allowedUnsafe"},
		{"node-wide", map[string]string{"kernel.core_pattern": "|/bin/evil"}, Pod{}, "kernel.core_pattern", "not namespaced"},
		{"traversal", map[string]string{"net/ipv4/../../kernel/core_pattern": "x"}, Pod{}, "net/ipv4/../../kernel/core_pattern", "malformed"},
		{"net on host network", map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Pod{HostNetwork: true}, "net.ipv4.tcp_keepalive_time", "host's network"},
		{"ipc on host ipc", map[string]string{"kernel.msgmax": "65536"}, Pod{HostIPC: true}, "kernel.msgmax", "host's IPC"},
		{"ipc with host network is fine", map[string]string{"kernel.shm_rmid_forced": "1"}, Pod{HostNetwork: true}, "", ""},
		{"bad value", map[string]string{"net.ipv4.tcp_keepalive_time": "soon"}, Pod{}, "net.ipv4.tcp_keepalive_time", "not a plain decimal integer"},
		{"newline smuggling", map[string]string{"net.core.somaxconn": "1\n2"}, Pod{}, "net.core.somaxconn", "printable"},
		{"set twice in two spellings", map[string]string{"net.ipv4.tcp_keepalive_time": "600", "net/ipv4/tcp_keepalive_time": "60"}, Pod{}, "net/ipv4/tcp_keepalive_time", "set twice"},
		{"port range below unprivileged ports", map[string]string{"net.ipv4.ip_local_port_range": "1000 2000"}, Pod{}, "net.ipv4.ip_local_port_range", "below net.ipv4.ip_unprivileged_port_start 1024"},
		{"port range fine with lowered unprivileged start", map[string]string{"net.ipv4.ip_local_port_range": "1000 2000", "net.ipv4.ip_unprivileged_port_start": "0"}, Pod{}, "", ""},
		{"unprivileged start above the default range", map[string]string{"net.ipv4.ip_unprivileged_port_start": "40000"}, Pod{}, "net.ipv4.ip_local_port_range", "starts at 32768"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := p.Complete(tc.pod, tc.sysctls)
			if tc.rejected == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			var rej *RejectedError
			if !errors.As(err, &rej) || rej.Sysctl != tc.rejected || !strings.Contains(rej.Reason, tc.why) {
				t.Fatalf("got %v, want %s rejected for %q", err, tc.rejected, tc.why)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.Is(errdefs.Resolve(err), errdefs.ErrInvalidArgument) {
				t.Errorf("%v is not an errdefs.ErrInvalidArgument", err)
			}
			// What the kubelet reads: the message is the refusal's own, as before errdefs.
			if want := fmt.Sprintf("sysctl %q: %s", tc.rejected, rej.Reason); err.Error() != want {
				t.Errorf("message %q, want %q", err, want)
			}
		})
	}
}

// TestUnsafeSysctlModes: without an allowlist podgate trusts the kubelet's admission of
// namespaced unsafe sysctls; with one it enforces it. Every other refusal holds in both modes.
func TestUnsafeSysctlModes(t *testing.T) {
	root := fakeProcSys(t)
	trusting, err := NewPolicy(Config{}, modern, root)
	if err != nil {
		t.Fatal(err)
	}
	enforcing, err := NewPolicy(Config{AllowedUnsafe: []string{"net.core.somaxconn"}}, modern, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		policy  *Policy
		sysctls map[string]string
		pod     Pod
		why     string // "" = accepted
	}{
		// The CRI validation suite's "should support unsafe sysctls".
		{"trusting: kernel.msgmax", trusting, map[string]string{"kernel.msgmax": "10000"}, Pod{}, ""},
		{"trusting: fs.mqueue.msg_max", trusting, map[string]string{"fs.mqueue.msg_max": "100"}, Pod{}, ""},
		{"trusting: net.core.somaxconn", trusting, map[string]string{"net.core.somaxconn": "4096"}, Pod{}, ""},
		{"trusting: IPC admitted through a kubelet pattern", trusting, map[string]string{"kernel.shm_next_id": "1"}, Pod{}, ""},
		{"trusting: safe", trusting, map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Pod{}, ""},
		{"trusting: node-wide", trusting, map[string]string{"kernel.core_pattern": "|/bin/evil"}, Pod{}, "not namespaced: it would change the whole node"},
		{"trusting: net.* on host network", trusting, map[string]string{"net.core.somaxconn": "4096"}, Pod{HostNetwork: true}, "the pod uses the host's network namespace"},
		{"trusting: IPC on host IPC", trusting, map[string]string{"fs.mqueue.msg_max": "100"}, Pod{HostIPC: true}, "the pod uses the host's IPC namespace"},
		{"trusting: malformed", trusting, map[string]string{"net/ipv4/../../kernel/core_pattern": "x"}, Pod{}, "malformed"},
		{"trusting: bad value", trusting, map[string]string{"kernel.msgmax": "1\n2"}, Pod{}, "printable"},
		{"trusting: UTS", trusting, map[string]string{"kernel.domainname": "x"}, Pod{}, "podgate handles only network and IPC sysctls"},
		{"trusting: user namespace", trusting, map[string]string{"user.max_user_namespaces": "1"}, Pod{}, "podgate handles only network and IPC sysctls"},
		{"enforcing: listed", enforcing, map[string]string{"net.core.somaxconn": "4096"}, Pod{}, ""},
		{"enforcing: safe", enforcing, map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Pod{}, ""},
		{"enforcing: kernel.msgmax unlisted", enforcing, map[string]string{"kernel.msgmax": "10000"}, Pod{}, "unsafe and not in sysctls.allowedUnsafe"},
		{"enforcing: fs.mqueue.msg_max unlisted", enforcing, map[string]string{"fs.mqueue.msg_max": "100"}, Pod{}, "unsafe and not in sysctls.allowedUnsafe"},
		{"enforcing: net unlisted", enforcing, map[string]string{"net.ipv4.tcp_max_syn_backlog": "64"}, Pod{}, "unsafe and not in sysctls.allowedUnsafe"},
		{"enforcing: node-wide", enforcing, map[string]string{"kernel.core_pattern": "core"}, Pod{}, "not namespaced: it would change the whole node"},
		{"enforcing: net.* on host network", enforcing, map[string]string{"net.core.somaxconn": "4096"}, Pod{HostNetwork: true}, "the pod uses the host's network namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.policy.Complete(tc.pod, tc.sysctls)
			if tc.why == "" {
				if err != nil {
					t.Fatalf("rejected: %v", err)
				}
				return
			}
			var rej *RejectedError
			if !errors.As(err, &rej) || !strings.Contains(rej.Reason, tc.why) {
				t.Fatalf("got %v, want a refusal for %q", err, tc.why)
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("%v is not an errdefs.ErrInvalidArgument", err)
			}
		})
	}
}

// TestTrustingKeepsKernelGates: trusting the kubelet's admission of unsafe sysctls does not
// extend to a safe sysctl the running kernel does not namespace; the kubelet does not know the
// node's kernel.
func TestTrustingKeepsKernelGates(t *testing.T) {
	p, err := NewPolicy(Config{}, KernelVersion{4, 4}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = p.Complete(Pod{}, map[string]string{"net.ipv4.tcp_keepalive_time": "600"})
	if err == nil || !strings.Contains(err.Error(), "namespaced only from kernel 4.5") {
		t.Errorf("got %v, want a refusal naming kernel 4.5", err)
	}
}

func TestKernelGates(t *testing.T) {
	for _, tc := range []struct {
		kernel KernelVersion
		name   string
		ok     bool
	}{
		{KernelVersion{4, 4}, "net.ipv4.tcp_keepalive_time", false},
		{KernelVersion{4, 5}, "net.ipv4.tcp_keepalive_time", true},
		{KernelVersion{4, 5}, "net.ipv4.tcp_fin_timeout", false},
		{KernelVersion{4, 6}, "net.ipv4.tcp_fin_timeout", true},
		{KernelVersion{4, 14}, "net.ipv4.tcp_rmem", false},
		{KernelVersion{4, 15}, "net.ipv4.tcp_wmem", true},
		{KernelVersion{3, 15}, "net.ipv4.ip_local_reserved_ports", false},
		{KernelVersion{3, 16}, "net.ipv4.ip_local_reserved_ports", true},
		{KernelVersion{3, 10}, "net.ipv4.ip_local_port_range", true},
		{KernelVersion{3, 99}, "net.ipv4.tcp_slow_start_after_idle", false},
		{KernelVersion{5, 0}, "net.ipv4.tcp_slow_start_after_idle", true},
	} {
		p, err := NewPolicy(Config{}, tc.kernel, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		v := "1"
		if f := formats[Name(tc.name)]; f != nil && f("1") != nil {
			v = map[string]string{"net.ipv4.tcp_rmem": "1 2 3", "net.ipv4.tcp_wmem": "1 2 3", "net.ipv4.ip_local_port_range": "32768 60999"}[tc.name]
		}
		_, _, err = p.Complete(Pod{}, map[string]string{tc.name: v})
		if (err == nil) != tc.ok {
			t.Errorf("kernel %s, %s: %v, want ok=%v", tc.kernel, tc.name, err, tc.ok)
		}
		if !tc.ok && (err == nil || !strings.Contains(err.Error(), "namespaced only from kernel")) {
			t.Errorf("kernel %s, %s: error %v does not say why", tc.kernel, tc.name, err)
		}
	}
}

func TestCompleteAddsDefaults(t *testing.T) {
	p, err := NewPolicy(Config{
		PodDefaults:       map[string]string{"net.ipv4.tcp_keepalive_time": "600", "kernel.shm_rmid_forced": "1"},
		NamespaceDefaults: map[string]map[string]string{"kube-system": {"net.ipv4.tcp_keepalive_time": "300"}},
	}, modern, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		pod   Pod
		in    map[string]string
		want  map[string]string
		added []Name
	}{
		{"node default", Pod{Namespace: "default"}, nil,
			map[string]string{"net.ipv4.tcp_keepalive_time": "600", "kernel.shm_rmid_forced": "1"},
			[]Name{"kernel.shm_rmid_forced", "net.ipv4.tcp_keepalive_time"}},
		{"namespace default wins", Pod{Namespace: "kube-system"}, nil,
			map[string]string{"net.ipv4.tcp_keepalive_time": "300", "kernel.shm_rmid_forced": "1"},
			[]Name{"net.ipv4.tcp_keepalive_time", "kernel.shm_rmid_forced"}},
		{"pod's own value wins, in any spelling", Pod{Namespace: "kube-system"}, map[string]string{"net/ipv4/tcp_keepalive_time": "45"},
			map[string]string{"net/ipv4/tcp_keepalive_time": "45", "kernel.shm_rmid_forced": "1"},
			[]Name{"kernel.shm_rmid_forced"}},
		{"host network gets no net.* default", Pod{HostNetwork: true}, nil,
			map[string]string{"kernel.shm_rmid_forced": "1"}, []Name{"kernel.shm_rmid_forced"}},
		{"host network and IPC get nothing", Pod{HostNetwork: true, HostIPC: true}, map[string]string{},
			map[string]string{}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, added, err := p.Complete(tc.pod, tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if len(out) != len(tc.want) {
				t.Errorf("got %v, want %v", out, tc.want)
			}
			for k, v := range tc.want {
				if out[k] != v {
					t.Errorf("%s = %q, want %q (all: %v)", k, out[k], v, out)
				}
			}
			if !slices.Equal(added, tc.added) {
				t.Errorf("added %v, want %v", added, tc.added)
			}
		})
	}
}

func TestDefaultsAreValidatedAtStart(t *testing.T) {
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{PodDefaults: map[string]string{"kernel.core_pattern": "core"}}, "sysctls.podDefaults"},
		{Config{PodDefaults: map[string]string{"net.ipv4.tcp_keepalive_time": "forever"}}, "sysctls.podDefaults"},
		// Defaults are podgate's own: no kubelet admitted them, so an empty allowlist does not
		// let an unsafe one through.
		{Config{NamespaceDefaults: map[string]map[string]string{"web": {"net.core.somaxconn": "1"}}}, "sysctls.namespaceDefaults.web"},
		{Config{PodDefaults: map[string]string{"kernel.msgmax": "1"}}, "not in sysctls.allowedUnsafe"},
		{Config{PodDefaults: map[string]string{"net.core.somaxconn": "1024"}}, "not in sysctls.allowedUnsafe"},
		{Config{PodDefaults: map[string]string{"net.ipv4.tcp_keepalive_time": "10 minutes"}}, "not a plain decimal integer"},
		{Config{NamespaceDefaults: map[string]map[string]string{"": {}}}, "empty namespace"},
	} {
		_, err := NewPolicy(tc.cfg, modern, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%+v: got %v, want an error naming %s", tc.cfg, err, tc.field)
		}
	}
	// An unsafe default is accepted once it is in the allowlist.
	cfg := Config{PodDefaults: map[string]string{"kernel.msgmax": "1"}, AllowedUnsafe: []string{"kernel.msgmax"}}
	if _, err := NewPolicy(cfg, modern, fakeProcSys(t)); err != nil {
		t.Errorf("%+v: %v", cfg, err)
	}
}

// TestPodSysctlsInPatternNamespaces: as in the kubelet, a pod's sysctl is in the namespace of
// the allowlist entry that admits it, also when the kubelet's library does not list the name.
func TestPodSysctlsInPatternNamespaces(t *testing.T) {
	root := fakeProcSys(t)
	p, err := NewPolicy(Config{AllowedUnsafe: []string{"kernel.shm*", "kernel.sem*"}}, modern, root)
	if err != nil {
		t.Fatal(err)
	}
	strict, err := NewPolicy(Config{AllowedUnsafe: []string{"kernel.sem*"}}, modern, root)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		policy *Policy
		sysctl string
		pod    Pod
		why    string // "" = accepted
	}{
		{"listed by the library", p, "kernel.shmmax", Pod{}, ""},
		{"admitted by kernel.shm*", p, "kernel.shm_next_id", Pod{}, ""},
		{"admitted by kernel.sem*", p, "kernel.sem_next_id", Pod{}, ""},
		{"IPC through its pattern", p, "kernel.shm_next_id", Pod{HostIPC: true}, "host's IPC"},
		{"not allowlisted", strict, "kernel.shm_next_id", Pod{}, "not in sysctls.allowedUnsafe"},
		{"IPC through its pattern, not allowlisted", strict, "kernel.shm_next_id", Pod{HostIPC: true}, "host's IPC"},
		{"UTS", p, "kernel.domainname", Pod{}, "podgate handles only network and IPC sysctls"},
		{"user namespace", p, "user.max_user_namespaces", Pod{}, "podgate handles only network and IPC sysctls"},
		{"node-wide", p, "kernel.core_pattern", Pod{}, "not namespaced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := tc.policy.Complete(tc.pod, map[string]string{tc.sysctl: "1"})
			switch {
			case tc.why == "" && err != nil:
				t.Fatalf("rejected: %v", err)
			case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
				t.Fatalf("got %v, want a refusal for %q", err, tc.why)
			}
		})
	}
}

func TestPodNamespace(t *testing.T) {
	for n, want := range map[Name]Namespace{
		"net.ipv4.tcp_keepalive_time": NetNamespace,
		"kernel.shmmax":               IPCNamespace,
		"kernel.shm_next_id":          IPCNamespace, // kernel.shm*
		"kernel.msg_next_id":          IPCNamespace, // kernel.msg*
		"kernel.sem_next_id":          IPCNamespace, // kernel.sem*
		"fs.mqueue.msg_max":           IPCNamespace,
		"kernel.domainname":           UTSNamespace,
		"user.max_user_namespaces":    UserNamespace,
		"kernel.core_pattern":         NoNamespace,
		"kernel.auto_msgmni":          NoNamespace, // IPC in the kernel, but no kubelet entry admits it
		"netx.foo":                    NoNamespace,
		"fs.mqueuex":                  NoNamespace,
	} {
		if got := podNamespace(n); got != want {
			t.Errorf("podNamespace(%q) = %q, want %q", n, got, want)
		}
	}
}

// TestAllowedUnsafeUnsetTrustsTheKubelet: without allowedUnsafe, unset or empty, a pod's unsafe
// namespaced sysctls pass (the kubelet admitted them); with it they must be listed.
func TestAllowedUnsafeUnsetTrustsTheKubelet(t *testing.T) {
	root := fakeProcSys(t)
	pod := map[string]string{"kernel.msgmax": "10000", "fs.mqueue.msg_max": "100"}
	for _, tc := range []struct {
		name    string
		allowed []string
		why     string // "" = accepted
	}{
		{"unset", nil, ""},
		{"empty", []string{}, ""},
		{"both listed", []string{"kernel.msg*", "fs.mqueue.*"}, ""},
		{"one listed", []string{"kernel.msg*"}, "unsafe and not in sysctls.allowedUnsafe"},
	} {
		policy, err := NewPolicy(Config{AllowedUnsafe: tc.allowed}, modern, root)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		_, _, err = policy.Complete(Pod{}, pod)
		switch {
		case tc.why == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.why != "" && (err == nil || !strings.Contains(err.Error(), tc.why)):
			t.Errorf("%s: got %v, want a refusal for %q", tc.name, err, tc.why)
		}
	}
}

// TestParseNode: the node sysctls (sysctls.node) must exist on this node and have a value the
// kernel takes; each bad one is named.
func TestParseNode(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "vm"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "vm", "swappiness"), []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ParseNode(map[string]string{"vm/swappiness": "60"}, root)
	if err != nil || got["vm.swappiness"] != "60" {
		t.Errorf("ParseNode(vm/swappiness) = %v, %v; want vm.swappiness 60", got, err)
	}
	_, err = ParseNode(map[string]string{"net.netfilter.no_such": "1", "vm.swappiness": "1\n2"}, root)
	for _, want := range []string{`sysctls.node "net.netfilter.no_such"`, `sysctls.node "vm.swappiness"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseNode: %v, want an error with %s", err, want)
		}
	}
}

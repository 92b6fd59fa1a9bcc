package sysctl

import (
	"context"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
)

// kubeletPolicy has podgate defaults and kubelet defaults that overlap: tcp_keepalive_time with
// another value, shm_rmid_forced with the same; user.max_user_namespaces is the kubelet's
// alone, in a namespace podgate does not handle.
func kubeletPolicy(t *testing.T) *Policy {
	t.Helper()
	p, err := NewPolicy(Config{
		PodDefaults:       map[string]string{"net.ipv4.tcp_keepalive_time": "600", "kernel.shm_rmid_forced": "1", "net.ipv4.tcp_syncookies": "1"},
		NamespaceDefaults: map[string]map[string]string{"kube-system": {"net/ipv4/tcp_keepalive_time": "300"}},
		KubeletDefaults:   map[string]string{"net/ipv4/tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1", "user.max_user_namespaces": "10"},
	}, modern, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCompleteKubeletDefaultsWin: the kubelet's defaults win over podgate's node and namespace
// defaults, the pod's own value over all; a kubelet default the request lacks is added (to be
// read back), one already there is not added again; host namespaces get none.
func TestCompleteKubeletDefaultsWin(t *testing.T) {
	p := kubeletPolicy(t)
	for _, tc := range []struct {
		name  string
		pod   Pod
		in    map[string]string
		want  map[string]string
		added []Name
	}{
		{"the kubelet sent its defaults", Pod{Namespace: "default"},
			map[string]string{"net.ipv4.tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1"},
			map[string]string{"net.ipv4.tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1", "net.ipv4.tcp_syncookies": "1"},
			[]Name{"net.ipv4.tcp_syncookies"}},
		{"kubelet default missing from the request, over the namespace's", Pod{Namespace: "kube-system"}, nil,
			map[string]string{"net.ipv4.tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1", "net.ipv4.tcp_syncookies": "1"},
			[]Name{"kernel.shm_rmid_forced", "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_syncookies"}},
		{"pod's own value wins over the kubelet's", Pod{Namespace: "kube-system"}, map[string]string{"net.ipv4.tcp_keepalive_time": "45", "kernel.shm_rmid_forced": "1"},
			map[string]string{"net.ipv4.tcp_keepalive_time": "45", "kernel.shm_rmid_forced": "1", "net.ipv4.tcp_syncookies": "1"},
			[]Name{"net.ipv4.tcp_syncookies"}},
		{"host network gets no net.* default of either", Pod{HostNetwork: true}, map[string]string{"kernel.shm_rmid_forced": "1"},
			map[string]string{"kernel.shm_rmid_forced": "1"}, nil},
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
			if _, ok := out["user.max_user_namespaces"]; ok {
				t.Errorf("user.max_user_namespaces added: podgate does not handle the user namespace (all: %v)", out)
			}
			if !slices.Equal(added, tc.added) {
				t.Errorf("added %v, want %v", added, tc.added)
			}
		})
	}
}

// TestCheckStageVerifiesKubeletDefaults: the check stage records the kubelet's defaults in what
// the verification reads back, whether the kubelet sent them (request left as it came) or not
// (added to the forwarded copy).
func TestCheckStageVerifiesKubeletDefaults(t *testing.T) {
	g := NewStages(kubeletPolicy(t), VerifyWarn, nil, prometheus.NewRegistry())
	req := func(sysctls map[string]string) *runtimeapi.RunPodSandboxRequest {
		return &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "default"},
			Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: sysctls},
		}}
	}
	ctx := klog.NewContext(context.Background(), klog.Background())

	sent := req(map[string]string{"net.ipv4.tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1", "net.ipv4.tcp_syncookies": "1"})
	sb := &pipeline.Sandbox{Req: sent}
	if err := g.check(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if sb.Req != sent {
		t.Errorf("request replaced though it held every default: %v", sb.Req.GetConfig().GetLinux().GetSysctls())
	}
	if got := g.held(sb).Applied["net.ipv4.tcp_keepalive_time"]; got != "120" {
		t.Errorf("read back net.ipv4.tcp_keepalive_time = %q, want the kubelet's 120 (applied: %v)", got, g.held(sb).Applied)
	}

	lacking := req(map[string]string{"net.ipv4.tcp_syncookies": "1"})
	sb = &pipeline.Sandbox{Req: lacking}
	if err := g.check(ctx, sb); err != nil {
		t.Fatal(err)
	}
	fwd := sb.Req.GetConfig().GetLinux().GetSysctls()
	for k, v := range map[string]string{"net.ipv4.tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1"} {
		if fwd[k] != v || g.held(sb).Applied[k] != v {
			t.Errorf("%s: forwarded %q, read back %q; want the kubelet's %q", k, fwd[k], g.held(sb).Applied[k], v)
		}
	}
	if len(lacking.GetConfig().GetLinux().GetSysctls()) != 1 {
		t.Errorf("the kubelet's request was changed in place: %v", lacking.GetConfig().GetLinux().GetSysctls())
	}
}

// TestDefaultConflicts: a default podgate and the kubelet both set, to different values, is
// one conflict naming the key, podgate's field and both values; the same value in another
// spelling is none.
func TestDefaultConflicts(t *testing.T) {
	got := DefaultConflicts(Config{
		PodDefaults: map[string]string{"net.ipv4.tcp_keepalive_time": "600", "kernel.shm_rmid_forced": "1",
			"net.ipv4.ip_local_port_range": "1024 65000", "net.ipv4.tcp_syncookies": "1"},
		NamespaceDefaults: map[string]map[string]string{"kube-system": {"net/ipv4/tcp_keepalive_time": "300"}, "web": {"kernel.shm_rmid_forced": "0"}},
		KubeletDefaults: map[string]string{"net/ipv4/tcp_keepalive_time": "120", "kernel.shm_rmid_forced": "1",
			"net.ipv4.ip_local_port_range": "1024\t65000"},
	})
	want := []Conflict{
		{Name: "net.ipv4.tcp_keepalive_time", Field: "sysctls.podDefaults", Podgate: "600", Kubelet: "120"},
		{Name: "net.ipv4.tcp_keepalive_time", Field: "sysctls.namespaceDefaults.kube-system", Podgate: "300", Kubelet: "120"},
		{Name: "kernel.shm_rmid_forced", Field: "sysctls.namespaceDefaults.web", Podgate: "0", Kubelet: "1"},
	}
	if !slices.Equal(got, want) {
		t.Errorf("DefaultConflicts = %+v\nwant %+v", got, want)
	}
	const line = `sysctl net.ipv4.tcp_keepalive_time: sysctls.podDefaults sets "600", the kubelet's defaultPodSysctls "120": the kubelet's value wins`
	if got[0].String() != line {
		t.Errorf("String() = %q\nwant %q", got[0].String(), line)
	}
	if DefaultConflicts(Config{PodDefaults: map[string]string{"net.ipv4.tcp_syncookies": "1"}}) != nil {
		t.Error("conflicts without kubelet defaults")
	}
}

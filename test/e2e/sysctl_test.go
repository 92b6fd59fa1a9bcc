package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/rig"
)

// writeConfig writes a podgate configuration file with the given body and returns its path.
func writeConfig(t testing.TB, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "podgate.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func hostSysctl(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestPodSysctlsThroughPodgate(t *testing.T) {
	const keepalive = "/proc/sys/net/ipv4/tcp_keepalive_time"
	hostBefore := hostSysctl(t, keepalive)
	n := startNode(t, "--config", writeConfig(t, `
sysctls:
  podDefaults: {net.ipv4.tcp_keepalive_time: "300"}
  namespaceDefaults: {kube-system: {net.ipv4.tcp_keepalive_time: "120"}}
  allowedUnsafe: ["net.core.somaxconn"]
`))
	ctx := t.Context()

	// readInPod starts a pod with the given sysctls and returns what its container reads.
	readInPod := func(t *testing.T, name, namespace string, sysctls map[string]string, file string) string {
		t.Helper()
		sb := &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: namespace, Uid: "uid-" + name},
			LogDirectory: filepath.Join(n.rig.Dir, "pods", name),
			Linux:        &runtimeapi.LinuxPodSandboxConfig{Sysctls: sysctls},
		}
		podID, err := n.through.Runtime.RunPodSandbox(ctx, sb, "")
		if err != nil {
			t.Fatalf("RunPodSandbox %s: %v", name, err)
		}
		ctrID, err := n.through.Runtime.CreateContainer(ctx, podID, &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "reader"},
			Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
			Command:  []string{"sleep", "3600"},
			Linux:    &runtimeapi.LinuxContainerConfig{},
		}, sb)
		if err != nil {
			t.Fatalf("CreateContainer: %v", err)
		}
		if err := n.through.Runtime.StartContainer(ctx, ctrID); err != nil {
			t.Fatalf("StartContainer: %v", err)
		}
		out, stderr, err := n.through.Runtime.ExecSync(ctx, ctrID, []string{"cat", file}, 10*time.Second)
		if err != nil {
			t.Fatalf("read %s in the pod: %v %s", file, err, stderr)
		}
		return strings.TrimSpace(string(out))
	}

	if got := readInPod(t, "asks600", "web", map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, keepalive); got != "600" {
		t.Errorf("pod asking 600 reads %s", got)
	}
	if got := readInPod(t, "nodefault", "web", nil, keepalive); got != "300" {
		t.Errorf("pod without the sysctl reads %s, want the node default 300", got)
	}
	if got := readInPod(t, "nsdefault", "kube-system", nil, keepalive); got != "120" {
		t.Errorf("kube-system pod reads %s, want its namespace default 120", got)
	}
	if got := readInPod(t, "unsafe-ok", "web", map[string]string{"net.core.somaxconn": "1234"}, "/proc/sys/net/core/somaxconn"); got != "1234" {
		t.Errorf("allowed unsafe sysctl reads %s, want 1234", got)
	}

	before, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sysctl, value, why string
	}{
		{"kernel.core_pattern", "|/bin/sh -c reboot", "not namespaced"},
		{"net.ipv4.tcp_max_syn_backlog", "64", "not in sysctls.allowedUnsafe"},
		{"net/ipv4/../../kernel/core_pattern", "x", "malformed"},
		{"net.ipv4.tcp_keepalive_time", "600\n", "printable"},
	} {
		name := fmt.Sprintf("refused-%d", len(tc.why))
		_, err := n.through.Runtime.RunPodSandbox(ctx, &runtimeapi.PodSandboxConfig{
			Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "web", Uid: "uid-" + name},
			Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{tc.sysctl: tc.value}},
		}, "")
		st := status.Convert(err)
		if st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.sysctl) || !strings.Contains(st.Message(), tc.why) {
			t.Errorf("%s=%q: got %v, want InvalidArgument naming it and %q", tc.sysctl, tc.value, err, tc.why)
		}
	}
	after, err := n.direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("containerd has %d sandboxes after the refusals, had %d: something was created", len(after), len(before))
	}
	if got := hostSysctl(t, keepalive); got != hostBefore {
		t.Errorf("host %s changed from %s to %s", keepalive, hostBefore, got)
	}
	metrics, err := n.podgate.Metrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Defaults went to nodefault, nsdefault and unsafe-ok (which sets only somaxconn).
	for _, m := range []string{"podgate_sysctl_pods_rejected_total 4", `podgate_sysctl_verifications_total{result="ok"} 4`, "podgate_sysctl_defaults_added_total 3"} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %q", m)
		}
	}
}

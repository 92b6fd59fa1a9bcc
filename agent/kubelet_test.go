package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/podresources/cgroup"
)

// bufferedLogger logs into a buffer the test reads back.
func bufferedLogger(t *testing.T) (klog.Logger, func() string) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	return logger, func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
}

// writeKubeletConfig writes a kubelet configuration file of body into a new directory.
func writeKubeletConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubelet.yaml")
	if err := os.WriteFile(path, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestKubeletViewLearnsVersion: on cgroup v2 with the gate left to its default, the kubelet is
// not known to write memory QoS until its version is; a 1.37 kubelet then does, and memory
// QoS's decision is logged again, once per change.
func TestKubeletViewLearnsVersion(t *testing.T) {
	logger, logged := bufferedLogger(t)
	v := newKubeletView(logger, writeKubeletConfig(t, "maxParallelImagePulls: 5\n"), cgroup.Node{Mode: cgroup.ModeUnified})
	if v.WritesMemoryQoS() {
		t.Error("kubelet writes memory QoS before its version is known")
	}
	v.LearnVersion(logger, "v1.37.2", true)
	if !v.WritesMemoryQoS() {
		t.Error("kubelet v1.37.2 on cgroup v2: not writing memory QoS")
	}
	v.LearnVersion(logger, "v1.37.2", true) // no change: no line
	out := logged()
	const line = `Memory QoS writer="kubelet" podgate="verifies" reason="kubelet v1.37.2 MemoryQoS on by default, cgroup v2; podgate's memory QoS left to the kubelet"`
	if strings.Count(out, line) != 1 {
		t.Errorf("log:\n%s\nwant once: %s", out, line)
	}
	v.LearnVersion(logger, "v1.36.3", true)
	if v.WritesMemoryQoS() {
		t.Error("kubelet v1.36.3: writing memory QoS")
	}
	if !strings.Contains(logged(), `Memory QoS writer="podgate" podgate="writes"`) {
		t.Errorf("log:\n%s\nwant podgate to write beside kubelet v1.36.3", logged())
	}
	if n, _, _ := v.Get().PullCap(); n != 5 {
		t.Errorf("the kubelet's configuration was lost: pull cap %d, want 5", n)
	}
}

// TestKubeletViewUnreadableConfig: a kubelet configuration that cannot be read is said, and
// podgate decides without it.
func TestKubeletViewUnreadableConfig(t *testing.T) {
	logger, logged := bufferedLogger(t)
	path := writeKubeletConfig(t, "featureGates: [not a map]\n")
	v := newKubeletView(logger, path, cgroup.Node{Mode: cgroup.ModeUnified})
	if v.Get().Config != nil {
		t.Error("a configuration from an unreadable file")
	}
	if out := logged(); !strings.Contains(out, "The kubelet's configuration could not be read") || !strings.Contains(out, path) {
		t.Errorf("log:\n%s\nwant the unreadable file named", out)
	}
}

// TestLogKubeletDecisions: start-up logs one line per feature, and one line per default sysctl
// podgate and the kubelet set differently, naming the key and both values.
func TestLogKubeletDecisions(t *testing.T) {
	logger, logged := bufferedLogger(t)
	path := writeKubeletConfig(t, "featureGates: {MemoryQoS: true, DefaultPodSysctls: true}\n"+
		"defaultPodSysctls: {net.ipv4.tcp_keepalive_time: \"120\", kernel.shm_rmid_forced: \"1\"}\nserializeImagePulls: true\n")
	cfg := config.DefaultConfiguration()
	cfg.Resources.MemoryQoS = true
	cfg.Sysctls.PodDefaults = map[string]string{"net.ipv4.tcp_keepalive_time": "600", "kernel.shm_rmid_forced": "1"}
	four := int32(4)
	cfg.ImagePulls.MaxParallel = &four
	v := newKubeletView(logger, path, cgroup.Node{Mode: cgroup.ModeUnified})
	logKubeletDecisions(klog.NewContext(t.Context(), logger), v.Get(), cfg, true)
	out := logged()
	for _, want := range []string{
		`Memory QoS writer="kubelet" podgate="verifies" reason="featureGates.MemoryQoS: true in ` + path + `, cgroup v2; podgate's memory QoS left to the kubelet"`,
		`Default sysctls writer="kubelet+podgate"`,
		`Default sysctl set by podgate and by the kubelet to different values: the kubelet's wins sysctl="net.ipv4.tcp_keepalive_time" field="sysctls.podDefaults" podgate="600" kubelet="120" winner="kubelet"`,
		`Image pull caps writer="kubelet" podgate="never queues" reason="serializeImagePulls: true, one pull at a time`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log:\n%s\nwant: %s", out, want)
		}
	}
	if strings.Contains(out, `sysctl="kernel.shm_rmid_forced"`) {
		t.Errorf("log:\n%s\nkernel.shm_rmid_forced has the same value in both: no conflict", out)
	}
}

package kubeletinfo

import (
	"strings"
	"testing"
)

// TestMemoryQoSDecision: exactly one writer, named with its reason.
func TestMemoryQoSDecision(t *testing.T) {
	for _, tt := range []struct {
		name            string
		k               Kubelet
		asked           bool
		writer, podgate string
		reason          string
	}{
		{"kubelet 1.37 on cgroup v2", Kubelet{Version: "v1.37.2", CgroupV2: true}, true, WriterKubelet, "verifies", "kubelet v1.37.2 MemoryQoS on by default, cgroup v2; podgate's memory QoS left to the kubelet"},
		{"kubelet 1.36", Kubelet{Version: "v1.36.3", CgroupV2: true}, true, WriterPodgate, "writes", "kubelet v1.36.3 MemoryQoS off by default, cgroup v2"},
		{"version not known yet", Kubelet{CgroupV2: true}, true, WriterPodgate, "writes", "until the kubelet's version is known"},
		{"podgate's off, kubelet 1.36", Kubelet{Version: "v1.36.3", CgroupV2: true}, false, WriterNone, "off", "podgate's memory QoS off"},
		{"podgate's off, kubelet writes", Kubelet{Version: "v1.37.2", CgroupV2: true}, false, WriterKubelet, "verifies", "cgroup v2"},
		{"podgate's off, version not known yet", Kubelet{CgroupV2: true}, false, WriterUnknown, "verifies", "not known (no Node read); podgate's memory QoS off"},
		{"cgroup v1", Kubelet{Version: "v1.37.2"}, true, WriterNone, "off", "not cgroup v2, which the kubelet's memory QoS needs: neither"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.k.MemoryQoSDecision(tt.asked)
			if d.Feature != FeatureMemoryQoS || d.Writer != tt.writer || d.Podgate != tt.podgate || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("MemoryQoSDecision(%v) = %+v; want writer %s, podgate %s, reason containing %q", tt.asked, d, tt.writer, tt.podgate, tt.reason)
			}
		})
	}
	d := Kubelet{Version: "v1.37.2", CgroupV2: true}.MemoryQoSDecision(false)
	const line = `Memory QoS: writer=kubelet podgate=verifies reason="kubelet v1.37.2 MemoryQoS on by default, cgroup v2"`
	if d.String() != line {
		t.Errorf("String() = %s\nwant %s", d, line)
	}
	if kv := d.KeysAndValues(); len(kv) != 6 || kv[1] != WriterKubelet || kv[3] != "verifies" {
		t.Errorf("KeysAndValues() = %v", kv)
	}
}

// TestSysctlsDecision: the kubelet's defaults, podgate's, both, or none.
func TestSysctlsDecision(t *testing.T) {
	on := Kubelet{Version: "v1.37.2", ConfigPath: "/k.yaml", Config: config(t,
		"featureGates: {DefaultPodSysctls: true}\ndefaultPodSysctls: {net.ipv4.tcp_keepalive_time: \"120\"}")}
	for _, tt := range []struct {
		name               string
		k                  Kubelet
		podgate, conflicts int
		writer, reason     string
	}{
		{"both, one conflict", on, 2, 1, WriterKubelet + "+" + WriterPodgate, "1 of podgate's defaults differ and are left to the kubelet"},
		{"the kubelet's alone", on, 0, 0, WriterKubelet, "the kubelet's 1 defaults"},
		{"podgate's alone", Kubelet{}, 2, 0, WriterPodgate, "no defaultPodSysctls"},
		{"none", Kubelet{}, 0, 0, WriterNone, "no sysctls.podDefaults"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d := tt.k.SysctlsDecision(tt.podgate, tt.conflicts)
			if d.Writer != tt.writer || !strings.Contains(d.Reason, tt.reason) {
				t.Errorf("SysctlsDecision = %+v; want writer %s, reason containing %q", d, tt.writer, tt.reason)
			}
		})
	}
}

// TestPullsDecision: a kubelet cap that masks podgate's says so and what to set.
func TestPullsDecision(t *testing.T) {
	serial := Kubelet{Config: config(t, "")}
	d := serial.PullsDecision(true, []string{"imagePulls.maxParallel (4)"})
	if d.Writer != WriterKubelet || d.Podgate != "never queues" ||
		!strings.Contains(d.Reason, "serializeImagePulls unset: true by default") ||
		!strings.Contains(d.Reason, "never queue a pull: imagePulls.maxParallel (4)") ||
		!strings.Contains(d.Reason, "set serializeImagePulls: false") {
		t.Errorf("serialized kubelet under podgate's cap: %+v", d)
	}
	parallel := Kubelet{Config: config(t, "serializeImagePulls: false\nmaxParallelImagePulls: 10")}
	if d := parallel.PullsDecision(true, nil); d.Writer != WriterPodgate || d.Podgate != "caps" || !strings.Contains(d.Reason, "above podgate's caps") {
		t.Errorf("kubelet cap above podgate's: %+v", d)
	}
	if d := (Kubelet{}).PullsDecision(true, nil); d.Writer != WriterPodgate || !strings.Contains(d.Reason, "not read") {
		t.Errorf("kubelet's configuration not read: %+v", d)
	}
	if d := serial.PullsDecision(false, nil); d.Writer != WriterKubelet || d.Podgate != "shares" {
		t.Errorf("no podgate caps, serialized kubelet: %+v", d)
	}
}

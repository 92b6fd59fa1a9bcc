package kubeletinfo

import (
	"strings"
	"testing"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// config decodes a kubelet configuration as the kubelet's file would hold it.
func config(t *testing.T, text string) *kubeletconfig.KubeletConfiguration {
	t.Helper()
	c := &kubeletconfig.KubeletConfiguration{}
	if err := yaml.UnmarshalStrict([]byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"+text), c); err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGate: a gate set in the configuration file wins; else its default for the kubelet's
// version (MemoryQoS on from 1.37, DefaultPodSysctls off everywhere); unknown without either.
func TestGate(t *testing.T) {
	for _, tt := range []struct {
		name, version, config, gate string
		on, known                   bool
		why                         string
	}{
		{"MemoryQoS default 1.36", "v1.36.3", "", MemoryQoS, false, true, "kubelet v1.36.3 MemoryQoS off by default"},
		{"MemoryQoS default 1.37", "v1.37.2", "", MemoryQoS, true, true, "kubelet v1.37.2 MemoryQoS on by default"},
		{"MemoryQoS default, vendor suffix", "v1.37.2-eks-1", "", MemoryQoS, true, true, "on by default"},
		{"MemoryQoS off in the file on 1.37", "v1.37.2", "featureGates: {MemoryQoS: false}", MemoryQoS, false, true, "featureGates.MemoryQoS: false in /etc/kubelet.yaml"},
		{"MemoryQoS on in the file, version unknown", "", "featureGates: {MemoryQoS: true}", MemoryQoS, true, true, "featureGates.MemoryQoS: true"},
		{"MemoryQoS, version unknown", "", "", MemoryQoS, false, false, "not known"},
		{"MemoryQoS, version unreadable", "latest", "", MemoryQoS, false, false, `kubeletVersion "latest"`},
		{"DefaultPodSysctls off by default", "", "", DefaultPodSysctls, false, true, "off by default"},
		{"DefaultPodSysctls on in the file", "v1.37.2", "featureGates: {DefaultPodSysctls: true}", DefaultPodSysctls, true, true, "featureGates.DefaultPodSysctls: true"},
		{"untracked gate", "v1.37.2", "", "SomethingElse", false, false, "does not track"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			k := Kubelet{Version: tt.version, ConfigPath: "/etc/kubelet.yaml", Config: config(t, tt.config)}
			g := k.Gate(tt.gate)
			if g.On != tt.on || g.Known != tt.known || !strings.Contains(g.Why, tt.why) {
				t.Errorf("Gate(%s) = %+v, want on %v, known %v, why containing %q", tt.gate, g, tt.on, tt.known, tt.why)
			}
		})
	}
}

// TestWritesMemoryQoS: the kubelet writes memory QoS with its gate on and on cgroup v2 only.
func TestWritesMemoryQoS(t *testing.T) {
	for _, tt := range []struct {
		name          string
		k             Kubelet
		writes, known bool
	}{
		{"1.37, cgroup v2", Kubelet{Version: "v1.37.2", CgroupV2: true}, true, true},
		{"1.37, cgroup v1", Kubelet{Version: "v1.37.2"}, false, true},
		{"1.36, cgroup v2", Kubelet{Version: "v1.36.3", CgroupV2: true}, false, true},
		{"version unknown, cgroup v2", Kubelet{CgroupV2: true}, false, false},
		{"version unknown, cgroup v1", Kubelet{}, false, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			writes, known, why := tt.k.WritesMemoryQoS()
			if writes != tt.writes || known != tt.known || why == "" {
				t.Errorf("WritesMemoryQoS() = %v, %v, %q; want %v, %v and a reason", writes, known, why, tt.writes, tt.known)
			}
		})
	}
}

// TestPreparesDRAClaims: the kubelet's DRA manager prepares claims from 1.34, by its version;
// not known without a version it understands.
func TestPreparesDRAClaims(t *testing.T) {
	for _, tt := range []struct {
		version         string
		prepares, known bool
		why             string
	}{
		{"v1.36.3", true, true, "kubelet v1.36.3 prepares DRA claims"},
		{"v1.34.0", true, true, "prepares DRA claims"},
		{"v1.34.1-eks-1", true, true, "prepares DRA claims"},
		{"v1.33.5", false, true, "kubelet v1.33.5 predates DRA on by default (1.34)"},
		{"", false, false, "no Node read"},
		{"latest", false, false, `kubeletVersion "latest"`},
	} {
		t.Run(tt.version, func(t *testing.T) {
			prepares, known, why := Kubelet{Version: tt.version}.PreparesDRAClaims()
			if prepares != tt.prepares || known != tt.known || !strings.Contains(why, tt.why) {
				t.Errorf("PreparesDRAClaims() = %v, %v, %q; want %v, %v, a reason containing %q", prepares, known, why, tt.prepares, tt.known, tt.why)
			}
		})
	}
}

// TestDefaultPodSysctls: the kubelet's defaults count only with its gate on.
func TestDefaultPodSysctls(t *testing.T) {
	const defaults = "defaultPodSysctls: {net.ipv4.tcp_keepalive_time: \"120\"}\n"
	for _, tt := range []struct {
		name, version, config string
		want                  string
	}{
		{"gate on", "v1.37.2", defaults + "featureGates: {DefaultPodSysctls: true}", "120"},
		{"gate on, version not known yet", "", defaults + "featureGates: {DefaultPodSysctls: true}", "120"},
		{"gate off by default", "v1.37.2", defaults, ""},
		{"older kubelet", "v1.36.3", defaults + "featureGates: {DefaultPodSysctls: true}", ""},
		{"none set", "v1.37.2", "featureGates: {DefaultPodSysctls: true}", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, why := Kubelet{Version: tt.version, ConfigPath: "/k.yaml", Config: config(t, tt.config)}.DefaultPodSysctls()
			if got["net.ipv4.tcp_keepalive_time"] != tt.want || (tt.want == "" && got != nil) || why == "" {
				t.Errorf("DefaultPodSysctls() = %v, %q; want tcp_keepalive_time %q and a reason", got, why, tt.want)
			}
		})
	}
	if got, why := (Kubelet{}).DefaultPodSysctls(); got != nil || !strings.Contains(why, "resources.kubeletConfig unset") {
		t.Errorf("without a configuration: %v, %q", got, why)
	}
}

// TestPullCap follows the kubelet's defaulting: serializeImagePulls is true unless set, or
// unless maxParallelImagePulls is 2 or more.
func TestPullCap(t *testing.T) {
	for _, tt := range []struct {
		name, config string
		want         int
	}{
		{"nothing set: serialized", "", 1},
		{"serializeImagePulls true", "serializeImagePulls: true", 1},
		{"serializeImagePulls false, no max", "serializeImagePulls: false", 0},
		{"max 5 alone: parallel", "maxParallelImagePulls: 5", 5},
		{"max 1 alone: serialized", "maxParallelImagePulls: 1", 1},
		{"false and max 3", "serializeImagePulls: false\nmaxParallelImagePulls: 3", 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, known, why := Kubelet{Config: config(t, tt.config)}.PullCap()
			if got != tt.want || !known || why == "" {
				t.Errorf("PullCap() = %d, %v, %q; want %d, known", got, known, why, tt.want)
			}
		})
	}
	if _, known, _ := (Kubelet{}).PullCap(); known {
		t.Error("PullCap known without the kubelet's configuration")
	}
}

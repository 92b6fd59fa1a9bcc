package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
)

// TestAllocatableFromKubeletConfig: the first cases are those of the kubelet's
// TestNodeAllocatableForEnforcement (k8s.io/kubernetes v1.36.3,
// pkg/kubelet/cm/node_container_manager_linux_test.go), the memory of
// GetNodeAllocatableAbsolute: a hard-eviction threshold does not change it.
func TestAllocatableFromKubeletConfig(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		kube, system, eviction map[string]string
		capacity               int64
		want                   int64
		errHas                 string // an invalid-argument error whose message has this
	}{
		{name: "kubelet test: 10Gi less 100Mi and 50Mi", kube: mem("100Mi"), system: mem("50Mi"), capacity: 10 * gib, want: 10090 * mib},
		{name: "kubelet test: eviction 100Mi not subtracted", kube: mem("100Mi"), system: mem("50Mi"), eviction: map[string]string{"memory.available": "100Mi"}, capacity: 10 * gib, want: 10090 * mib},
		{name: "kubelet test: eviction 5% not subtracted", kube: mem("100Mi"), system: mem("50Mi"), eviction: map[string]string{"memory.available": "5%"}, capacity: 10 * gib, want: 10090 * mib},
		{name: "kubelet test: no reservation", capacity: 10 * gib, want: 10 * gib},
		{name: "cpu only", kube: map[string]string{"cpu": "100m"}, capacity: 10 * gib, want: 10 * gib},
		{name: "fractional", system: mem("0.5Gi"), capacity: 10 * gib, want: 10*gib - 512*mib},
		{name: "decimal units", kube: mem("1G"), capacity: 10 * gib, want: 10*gib - 1_000_000_000},
		{name: "reserved above capacity: 0", kube: mem("8Gi"), system: mem("4Gi"), capacity: 10 * gib, want: 0},
		{name: "not a quantity", kube: mem("lots"), capacity: 10 * gib, errHas: `kubeReserved.memory "lots"`},
		{name: "negative", system: mem("-1Gi"), capacity: 10 * gib, errHas: `systemReserved.memory "-1Gi" is negative`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &kubeletconfig.KubeletConfiguration{KubeReserved: tc.kube, SystemReserved: tc.system, EvictionHard: tc.eviction}
			got, err := AllocatableFromKubeletConfig(cfg, tc.capacity)
			if tc.errHas != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want an invalid-argument error with %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("AllocatableFromKubeletConfig = %d, want %d", got, tc.want)
			}
		})
	}
}

// mem is a reservation of memory alone.
func mem(q string) map[string]string { return map[string]string{"memory": q} }

// TestAllocatableFromNode: the first two cases are the Node status of the kubelet's
// TestMachineInfo (k8s.io/kubernetes v1.36.3, pkg/kubelet/nodestatus/setters_test.go:
// "allocatable memory does not double-count hugepages reservations" and "hugepages
// reservation greater than node memory capacity should result in memory capacity set to 0"),
// whose GetNodeAllocatableAbsolute memory is the 1024 of capacity.
func TestAllocatableFromNode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		want   int64
		wantOK bool
	}{
		{"kubelet test: huge pages added back", node(map[string]string{"memory": "1024", "hugepages-test": "1"}, "1023"), 1024, true},
		{"kubelet test: huge pages above capacity", node(map[string]string{"memory": "1024", "hugepages-test": "1025"}, "0"), 1024, true},
		{"two huge page sizes", node(map[string]string{"memory": "16Gi", "hugepages-2Mi": "1Gi", "hugepages-1Gi": "2Gi"}, "11Gi"), 14 * gib, true},
		{"reserved and evicted", node(map[string]string{"memory": "16Gi"}, "14748Mi"), 14748 * mib, true}, // 16Gi − 1.5Gi − 100Mi
		{"no capacity in status", node(nil, "1Gi"), gib, true},
		{"no allocatable memory", node(map[string]string{"memory": "16Gi"}, ""), 0, false},
		{"no node", nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := AllocatableFromNode(tc.node)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("AllocatableFromNode = %d, %v; want %d, %v", got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

// node is a Node with this capacity and, unless "", this allocatable memory.
func node(capacity map[string]string, allocatable string) *corev1.Node {
	n := &corev1.Node{}
	n.Name = "node-1"
	if capacity != nil {
		n.Status.Capacity = corev1.ResourceList{}
		for k, v := range capacity {
			n.Status.Capacity[corev1.ResourceName(k)] = resource.MustParse(v)
		}
	}
	if allocatable != "" {
		n.Status.Allocatable = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(allocatable)}
	}
	return n
}

func TestNodeAllocatable(t *testing.T) {
	reserved := &kubeletconfig.KubeletConfiguration{KubeReserved: mem("1Gi"), SystemReserved: mem("512Mi")}
	broken := &kubeletconfig.KubeletConfiguration{KubeReserved: mem("-1Gi")}
	apiNode := node(map[string]string{"memory": "16Gi"}, "14748Mi")
	for _, tc := range []struct {
		name string
		src  NodeMemorySources
		want NodeMemory
	}{{
		name: "kubelet configuration and MemTotal",
		src:  NodeMemorySources{KubeletConfig: reserved, Node: apiNode, MemTotal: 16 * gib},
		want: NodeMemory{Bytes: 14848 * mib, Source: FromKubeletConfig},
	}, {
		name: "kubelet configuration, capacity from the Node",
		src:  NodeMemorySources{KubeletConfig: reserved, Node: apiNode},
		want: NodeMemory{Bytes: 14848 * mib, Source: FromKubeletConfig},
	}, {
		name: "kubelet configuration without a capacity",
		src:  NodeMemorySources{KubeletConfig: reserved},
		want: NodeMemory{Source: FromNothing, Skipped: []string{
			"kubeletConfig: the node's memory capacity is unknown (no MemTotal, no Node capacity)",
			"node: no Node object",
			"memTotal: unknown",
		}},
	}, {
		name: "broken kubelet configuration: the Node",
		src:  NodeMemorySources{KubeletConfig: broken, Node: apiNode, MemTotal: 16 * gib},
		want: NodeMemory{Bytes: 14748 * mib, Source: FromNode, Skipped: []string{
			`kubeletConfig: invalid argument: kubeReserved.memory "-1Gi" is negative`,
		}},
	}, {
		name: "the Node",
		src:  NodeMemorySources{Node: apiNode, MemTotal: 16 * gib},
		want: NodeMemory{Bytes: 14748 * mib, Source: FromNode, Skipped: []string{"kubeletConfig: no kubelet configuration"}},
	}, {
		name: "a Node without status: MemTotal",
		src:  NodeMemorySources{Node: node(nil, ""), MemTotal: 16 * gib},
		want: NodeMemory{Bytes: 16 * gib, Source: FromMemTotal, Skipped: []string{
			"kubeletConfig: no kubelet configuration",
			"node: the Node node-1 has no status.allocatable memory",
		}},
	}, {
		name: "MemTotal alone",
		src:  NodeMemorySources{MemTotal: 16 * gib},
		want: NodeMemory{Bytes: 16 * gib, Source: FromMemTotal, Skipped: []string{"kubeletConfig: no kubelet configuration", "node: no Node object"}},
	}, {
		name: "nothing",
		want: NodeMemory{Source: FromNothing, Skipped: []string{"kubeletConfig: no kubelet configuration", "node: no Node object", "memTotal: unknown"}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, NodeAllocatable(tc.src)); diff != "" {
				t.Errorf("NodeAllocatable (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNodeMemoryKeysAndValues(t *testing.T) {
	got := NodeMemory{Bytes: 1024, Source: FromNode, Skipped: []string{"kubeletConfig: no kubelet configuration"}}.KeysAndValues()
	want := []any{"bytes", int64(1024), "source", "node", "skipped", []string{"kubeletConfig: no kubelet configuration"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("KeysAndValues (-want +got):\n%s", diff)
	}
}

// kubeletConfigYAML is a kubelet configuration file of a real node's kind, with a field no
// version of these types has.
const kubeletConfigYAML = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: systemd
failSwapOn: false
kubeReserved:
  cpu: 100m
  memory: 1Gi
systemReserved:
  memory: 512Mi
evictionHard:
  memory.available: 100Mi
enforceNodeAllocatable: [pods]
memoryThrottlingFactor: 0.8
memoryReservationPolicy: TieredReservation
aFieldOfAFutureKubelet: true
`

func TestDecodeKubeletConfig(t *testing.T) {
	cfg, err := DecodeKubeletConfig([]byte(kubeletConfigYAML))
	if err != nil {
		t.Fatal(err)
	}
	factor := 0.8
	want := &kubeletconfig.KubeletConfiguration{
		CgroupDriver:            "systemd",
		KubeReserved:            map[string]string{"cpu": "100m", "memory": "1Gi"},
		SystemReserved:          map[string]string{"memory": "512Mi"},
		EvictionHard:            map[string]string{"memory.available": "100Mi"},
		EnforceNodeAllocatable:  []string{"pods"},
		MemoryThrottlingFactor:  &factor,
		MemoryReservationPolicy: kubeletconfig.TieredReservationMemoryReservationPolicy,
	}
	want.APIVersion, want.Kind = "kubelet.config.k8s.io/v1beta1", "KubeletConfiguration"
	failSwapOn := false
	want.FailSwapOn = &failSwapOn
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("DecodeKubeletConfig (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name, in string
		errHas   string // an invalid-argument error whose message has this; "" for none
		reserved map[string]string
	}{
		{"JSON", `{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration","kubeReserved":{"memory":"2Gi"}}`, "", mem("2Gi")},
		// The kubelet reads field names case-sensitively: KubeReserved is not kubeReserved.
		{"case-sensitive", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nKubeReserved: {memory: 2Gi}\n", "", nil},
		{"another kind", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: CredentialProviderConfig\n", `kind "CredentialProviderConfig"`, nil},
		{"another version", "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\n", `apiVersion "kubelet.config.k8s.io/v1"`, nil},
		{"no apiVersion", "kind: KubeletConfiguration\n", `apiVersion ""`, nil},
		{"not YAML", "kubeReserved: [\n", "invalid argument", nil},
		{"wrong type", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nkubeReserved: 3\n", "invalid argument", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := DecodeKubeletConfig([]byte(tc.in))
			if tc.errHas != "" {
				if !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want an invalid-argument error with %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.reserved, cfg.KubeReserved); diff != "" {
				t.Errorf("kubeReserved (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReadKubeletConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(kubeletConfigYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := ReadKubeletConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := AllocatableFromKubeletConfig(cfg, 16*gib)
	if err != nil || got != 14848*mib {
		t.Errorf("allocatable of the file = %d, %v; want %d", got, err, 14848*mib)
	}

	if _, err := ReadKubeletConfig(filepath.Join(dir, "missing.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want not exist", err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("kind: Pod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadKubeletConfig(bad); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), bad) {
		t.Errorf("wrong kind: err = %v, want an invalid-argument error naming %s", err, bad)
	}
}

func TestReadMemTotal(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, content string
		want          int64
		errHas        string
	}{
		{"meminfo", "MemTotal:       16314428 kB\nMemFree:         1234567 kB\n", 16314428 * 1024, ""},
		{"not first", "Foo: 1 kB\nMemTotal: 2048 kB\n", 2 * mib, ""},
		{"no MemTotal", "MemFree: 1 kB\n", 0, "no MemTotal line"},
		{"out of range", "MemTotal: 99999999999999999999 kB\n", 0, "out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadMemTotal(path)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want one with %q", err, tc.errHas)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ReadMemTotal = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	if _, err := ReadMemTotal(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want not exist", err)
	}
}

// TestReadMemTotalOfThisNode reads the real /proc/meminfo.
func TestReadMemTotalOfThisNode(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc/meminfo is Linux's")
	}
	got, err := ReadMemTotal(MeminfoPath)
	if err != nil {
		t.Fatal(err)
	}
	if got < 64*mib || got%1024 != 0 {
		t.Errorf("MemTotal = %d bytes: want a whole number of KiB, at least 64 MiB", got)
	}
}

package cgroup

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// MeminfoPath is where the kernel tells the node's memory.
const MeminfoPath = "/proc/meminfo"

// AllocatableSource says where a node's allocatable memory came from, best first.
type AllocatableSource string

// The sources of a node's allocatable memory, best first.
const (
	// FromKubeletConfig is MemTotal less the memory of the kubelet configuration's
	// kubeReserved and systemReserved: the figure the kubelet's memory QoS uses.
	FromKubeletConfig AllocatableSource = "kubeletConfig"
	// FromNode is the Node object's status.allocatable memory with the node's huge pages
	// added back: the kubelet's figure less its memory.available hard-eviction threshold.
	FromNode AllocatableSource = "node"
	// FromMemTotal is MemTotal alone: the kubelet's figure plus any reservation.
	FromMemTotal AllocatableSource = "memTotal"
	// FromNothing is no source at all: containers without a limit get no memory.high.
	FromNothing AllocatableSource = "none"
)

// NodeMemory is a node's allocatable memory, the ceiling of memory.high for a container
// without a memory limit, and where it came from.
type NodeMemory struct {
	// Bytes is the allocatable memory; 0 with FromNothing.
	Bytes int64
	// Source is where Bytes came from.
	Source AllocatableSource
	// Skipped says, for each better source, why it was not used.
	Skipped []string
}

// KeysAndValues are m as one log line's key/value pairs:
// logger.Info("Node allocatable memory", m.KeysAndValues()...).
func (m NodeMemory) KeysAndValues() []any {
	kv := []any{"bytes", m.Bytes, "source", string(m.Source)}
	if len(m.Skipped) > 0 {
		kv = append(kv, "skipped", m.Skipped)
	}
	return kv
}

// NodeMemorySources are what [NodeAllocatable] computes a node's allocatable memory from.
// Any of them may be missing.
type NodeMemorySources struct {
	// KubeletConfig is the kubelet's configuration file, decoded ([ReadKubeletConfig]); nil
	// when podgate is not told where it is.
	KubeletConfig *kubeletconfig.KubeletConfiguration
	// Node is this node's Node object; nil without the Kubernetes API.
	Node *corev1.Node
	// MemTotal is the node's memory in bytes ([ReadMemTotal]); 0 when unknown.
	MemTotal int64
}

// NodeAllocatable is the node's allocatable memory as the kubelet's memory QoS sees it, from
// the best source at hand:
//
//  1. the kubelet's configuration: capacity − systemReserved − kubeReserved (memory), at
//     least 0, as the kubelet's container manager computes it (GetNodeAllocatableAbsolute).
//     Capacity is MemTotal (what cAdvisor reads), else the Node's status.capacity. Hard
//     eviction thresholds and huge pages are not subtracted; enforceNodeAllocatable does not
//     matter. Flags that override the file (--kube-reserved, --system-reserved) are not seen.
//  2. the Node object: status.allocatable plus the huge pages of status.capacity, which the
//     kubelet subtracts from allocatable memory but not from its memory QoS figure. It is
//     still lower than the kubelet's figure by the memory.available hard-eviction threshold
//     (evictionHard, 100Mi by default), which the Node does not show.
//  3. MemTotal, the stated fallback: higher than the kubelet's figure by the reservations.
func NodeAllocatable(src NodeMemorySources) NodeMemory {
	var m NodeMemory
	if n, err := fromKubeletConfig(src); err != nil {
		m.Skipped = append(m.Skipped, string(FromKubeletConfig)+": "+err.Error())
	} else {
		m.Bytes, m.Source = n, FromKubeletConfig
		return m
	}
	if n, ok := AllocatableFromNode(src.Node); !ok {
		m.Skipped = append(m.Skipped, string(FromNode)+": "+nodeMissing(src.Node))
	} else {
		m.Bytes, m.Source = n, FromNode
		return m
	}
	if src.MemTotal > 0 {
		m.Bytes, m.Source = src.MemTotal, FromMemTotal
		return m
	}
	m.Skipped = append(m.Skipped, string(FromMemTotal)+": unknown")
	m.Source = FromNothing
	return m
}

// fromKubeletConfig is source 1 of NodeAllocatable.
func fromKubeletConfig(src NodeMemorySources) (int64, error) {
	if src.KubeletConfig == nil {
		return 0, errors.New("no kubelet configuration")
	}
	capacity := src.MemTotal
	if capacity <= 0 && src.Node != nil {
		if q, ok := src.Node.Status.Capacity[corev1.ResourceMemory]; ok {
			capacity = q.Value()
		}
	}
	if capacity <= 0 {
		return 0, errors.New("the node's memory capacity is unknown (no MemTotal, no Node capacity)")
	}
	return AllocatableFromKubeletConfig(src.KubeletConfig, capacity)
}

// nodeMissing says why a Node gives no allocatable memory.
func nodeMissing(n *corev1.Node) string {
	if n == nil {
		return "no Node object"
	}
	return "the Node " + n.Name + " has no status.allocatable memory"
}

// AllocatableFromKubeletConfig is capacity (bytes) less the memory of cfg's systemReserved
// and kubeReserved, at least 0: the kubelet's node allocatable memory for memory QoS. A
// reservation that is not a quantity, or is negative, is errdefs.ErrInvalidArgument (the
// kubelet refuses to start with it).
func AllocatableFromKubeletConfig(cfg *kubeletconfig.KubeletConfiguration, capacity int64) (int64, error) {
	value := *resource.NewQuantity(capacity, resource.BinarySI)
	for _, r := range []struct {
		key string
		m   map[string]string
	}{{"systemReserved", cfg.SystemReserved}, {"kubeReserved", cfg.KubeReserved}} {
		s, ok := r.m[string(corev1.ResourceMemory)]
		if !ok {
			continue
		}
		q, err := resource.ParseQuantity(s)
		if err != nil {
			return 0, fmt.Errorf("%w: %s.memory %q: %w", errdefs.ErrInvalidArgument, r.key, s, err)
		}
		if q.Sign() < 0 {
			return 0, fmt.Errorf("%w: %s.memory %q is negative", errdefs.ErrInvalidArgument, r.key, s)
		}
		value.Sub(q)
	}
	if value.Sign() < 0 {
		return 0, nil
	}
	return value.Value(), nil
}

// AllocatableFromNode is node's status.allocatable memory plus the huge pages of its
// status.capacity, at most its memory capacity: the kubelet's memory QoS figure less the
// memory.available hard-eviction threshold. ok is false without a node or without
// allocatable memory in its status.
func AllocatableFromNode(node *corev1.Node) (bytes int64, ok bool) {
	if node == nil {
		return 0, false
	}
	q, ok := node.Status.Allocatable[corev1.ResourceMemory]
	if !ok {
		return 0, false
	}
	value := q.DeepCopy()
	for name, c := range node.Status.Capacity {
		if strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix) {
			value.Add(c)
		}
	}
	// The kubelet stops at 0 when huge pages exceed the memory: never above the capacity.
	if c, ok := node.Status.Capacity[corev1.ResourceMemory]; ok && value.Cmp(c) > 0 {
		value = c.DeepCopy()
	}
	return value.Value(), true
}

// kubeletConfigKind is the apiVersion and kind of a kubelet configuration file.
var kubeletConfigKind = kubeletconfig.SchemeGroupVersion.WithKind("KubeletConfiguration")

// ReadKubeletConfig reads and decodes the kubelet's configuration file (its --config).
func ReadKubeletConfig(path string) (*kubeletconfig.KubeletConfiguration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kubelet configuration: %w", err)
	}
	cfg, err := DecodeKubeletConfig(b)
	if err != nil {
		return nil, fmt.Errorf("kubelet configuration %s: %w", path, err)
	}
	return cfg, nil
}

// DecodeKubeletConfig decodes a KubeletConfiguration of kubelet.config.k8s.io/v1beta1, YAML
// or JSON, with the kubelet's published types. Field names are case-sensitive, as the
// kubelet reads them; unknown fields are ignored, so that a newer kubelet's file still
// decodes. Another apiVersion or kind is errdefs.ErrInvalidArgument.
func DecodeKubeletConfig(data []byte) (*kubeletconfig.KubeletConfiguration, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	cfg := &kubeletconfig.KubeletConfiguration{}
	if err := json.UnmarshalCaseSensitivePreserveInts(js, cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", errdefs.ErrInvalidArgument, err)
	}
	if gvk := cfg.GroupVersionKind(); gvk != kubeletConfigKind {
		return nil, fmt.Errorf("%w: apiVersion %q, kind %q: want %q, %q", errdefs.ErrInvalidArgument,
			cfg.APIVersion, cfg.Kind, kubeletConfigKind.GroupVersion(), kubeletConfigKind.Kind)
	}
	return cfg, nil
}

// memTotalLine is MemTotal's line in /proc/meminfo, as cAdvisor (and so the kubelet) reads it.
var memTotalLine = regexp.MustCompile(`MemTotal:\s*([0-9]+) kB`)

// ReadMemTotal reads the node's memory in bytes from a meminfo file ([MeminfoPath]): its
// MemTotal, which is the kubelet's memory capacity.
func ReadMemTotal(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("read MemTotal: %w", err)
	}
	m := memTotalLine.FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("%s has no MemTotal line", path)
	}
	kib, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil || kib > (1<<53) {
		return 0, fmt.Errorf("%s: MemTotal %s kB is out of range", path, m[1])
	}
	return kib << 10, nil
}

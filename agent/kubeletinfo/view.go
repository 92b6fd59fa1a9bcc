package kubeletinfo

import (
	"sync/atomic"

	"k8s.io/klog/v2"
)

// View is the node's kubelet as podgate knows it while it runs: its configuration file and
// cgroup mode from start-up, its version once the Node is read. Features ask it through the
// plain values and functions agent hands them. Safe for concurrent use.
type View struct {
	k atomic.Pointer[Kubelet]
}

// NewView holds k, the kubelet as known at start-up.
func NewView(k Kubelet) *View {
	v := &View{}
	v.k.Store(&k)
	return v
}

// Get is the kubelet as known now.
func (v *View) Get() Kubelet { return *v.k.Load() }

// WritesMemoryQoS tells the resources feature whether the kubelet writes memory QoS itself, as
// far as is known: not before the kubelet's version decides its gate's default.
func (v *View) WritesMemoryQoS() bool {
	writes, known, _ := v.Get().WritesMemoryQoS()
	return known && writes
}

// LearnVersion records the kubelet's version from its Node and logs memory QoS's decision again
// when the version changed it; podgateQoS is whether podgate's own memory QoS is on.
func (v *View) LearnVersion(logger klog.Logger, version string, podgateQoS bool) {
	before := v.Get()
	after := before
	after.Version = version
	v.k.Store(&after)
	if d := after.MemoryQoSDecision(podgateQoS); d != before.MemoryQoSDecision(podgateQoS) {
		logger.Info(d.Feature, d.KeysAndValues()...)
	}
}

package registry

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// DeviceRecord is one device a DRA driver prepared for a claim.
type DeviceRecord struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
	// Requests are the claim's requests the device serves.
	Requests     []string `json:"requests,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// Network is the device's network interface, when it is one: what a CNI plugin needs to
	// move it into the pod. Nil for other devices.
	Network *DeviceNetworkRecord `json:"network,omitempty"`
}

// DeviceNetworkRecord is a prepared network device's interface: its host name (from the
// driver's ResourceSlice) and what the claim's configuration asks of it in the pod.
type DeviceNetworkRecord struct {
	HostInterface string `json:"hostInterface,omitempty"`
	// InterfaceName, MTU and Addresses are the claim's configuration (dra.InterfaceConfig).
	InterfaceName string   `json:"interfaceName,omitempty"`
	MTU           int      `json:"mtu,omitempty"`
	Addresses     []string `json:"addresses,omitempty"`
}

// ContainerClaims names a container of the pod and the pod's claims it uses
// (resources.claims), as the pod's spec had them when the claims were prepared.
type ContainerClaims struct {
	Name   string   `json:"name"`
	Claims []string `json:"claims,omitempty"`
}

// ClaimRecord is one ResourceClaim of a pod that podgate prepares.
type ClaimRecord struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// PodClaimName is the pod's name for the claim (spec.resourceClaims[].name).
	PodClaimName string `json:"podClaimName"`
	// Drivers are the drivers podgate calls for the claim.
	Drivers []string `json:"drivers"`
	// Prepared: every driver prepared the claim; Devices holds what they returned.
	Prepared bool           `json:"prepared"`
	Devices  []DeviceRecord `json:"devices,omitempty"`
}

// PodClaims are the DRA claims podgate prepared, or began to prepare, for one pod: its
// obligation to unprepare them once the pod is gone. They are recorded before any driver is
// called, so a crash never loses the obligation.
type PodClaims struct {
	Pod    PodRef        `json:"pod"`
	Claims []ClaimRecord `json:"claims"`
	// Containers are the pod's containers (restartable init containers first), so that the
	// PodResources service lists each claim under the right ones.
	Containers []ContainerClaims `json:"containers,omitempty"`
}

// Clone returns a deep copy of p.
func (p *PodClaims) Clone() PodClaims {
	c := PodClaims{Pod: p.Pod, Claims: slices.Clone(p.Claims), Containers: slices.Clone(p.Containers)}
	for i := range c.Containers {
		c.Containers[i].Claims = slices.Clone(c.Containers[i].Claims)
	}
	for i := range c.Claims {
		cl := &c.Claims[i]
		cl.Drivers = slices.Clone(cl.Drivers)
		cl.Devices = slices.Clone(cl.Devices)
		for j := range cl.Devices {
			cl.Devices[j].Requests = slices.Clone(cl.Devices[j].Requests)
			cl.Devices[j].CDIDeviceIDs = slices.Clone(cl.Devices[j].CDIDeviceIDs)
			if n := cl.Devices[j].Network; n != nil {
				nc := *n
				nc.Addresses = slices.Clone(n.Addresses)
				cl.Devices[j].Network = &nc
			}
		}
	}
	return c
}

// PodClaimsGetter returns the DRA claims podgate prepared for a pod.
type PodClaimsGetter interface {
	PodClaims(uid types.UID) (PodClaims, bool)
}

// PodClaims implements PodClaimsGetter.
func (r *Registry) PodClaims(uid types.UID) (PodClaims, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pc, ok := r.claims[uid]
	if !ok {
		return PodClaims{}, false
	}
	return pc.Clone(), true
}

// AllPodClaims returns every pod's claims, ordered by pod UID.
func (r *Registry) AllPodClaims() []PodClaims {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.allPodClaimsLocked()
}

func (r *Registry) allPodClaimsLocked() []PodClaims {
	out := make([]PodClaims, 0, len(r.claims))
	for _, pc := range r.claims {
		out = append(out, pc.Clone())
	}
	slices.SortFunc(out, func(a, b PodClaims) int { return compareStrings(string(a.Pod.UID), string(b.Pod.UID)) })
	return out
}

// SetPodClaims records a pod's claims, replacing what was recorded, and writes the checkpoint
// before it returns: call it before a driver is asked to prepare, so that a crash never loses
// the obligation to unprepare. On a write error nothing changes.
func (r *Registry) SetPodClaims(pc PodClaims) error {
	c := pc.Clone()
	r.mu.Lock()
	before := r.beforeLocked(pc.Pod.UID)
	prev := r.claims[pc.Pod.UID]
	r.claims[pc.Pod.UID] = &c
	r.changedLocked(pc.Pod.UID, before)
	r.mu.Unlock()
	if err := r.persist(); err != nil {
		r.mu.Lock()
		before := r.beforeLocked(pc.Pod.UID)
		if prev != nil {
			r.claims[pc.Pod.UID] = prev
		} else {
			delete(r.claims, pc.Pod.UID)
		}
		r.changedLocked(pc.Pod.UID, before)
		r.mu.Unlock()
		return err
	}
	return nil
}

// UpdatePodClaims records a pod's claims, replacing what was recorded; the checkpoint follows
// in the background. For what a crash may lose: the drivers' answers (a repeated prepare is
// harmless), not an obligation.
func (r *Registry) UpdatePodClaims(pc PodClaims) {
	c := pc.Clone()
	r.mu.Lock()
	before := r.beforeLocked(pc.Pod.UID)
	r.claims[pc.Pod.UID] = &c
	r.changedLocked(pc.Pod.UID, before)
	r.mu.Unlock()
	r.persistSoon()
}

// RemovePodClaims forgets a pod's claims once they are unprepared; the checkpoint follows in
// the background (a crash before it repeats the unprepare, which drivers accept).
func (r *Registry) RemovePodClaims(uid types.UID) {
	r.mu.Lock()
	_, ok := r.claims[uid]
	if ok {
		before := r.beforeLocked(uid)
		delete(r.claims, uid)
		r.changedLocked(uid, before)
	}
	r.mu.Unlock()
	if ok {
		r.persistSoon()
	}
}

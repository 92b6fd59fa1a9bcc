package registry

import (
	"fmt"
	"maps"
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

// ClaimRecord is one ResourceClaim of a pod that podgate prepares, as the pod sees it.
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

// PodClaims is one pod's view of its DRA claims: each claim's shared record (ClaimInfo) with
// the pod's name for it, and the pod's containers. The registry keeps one ClaimInfo per claim
// and builds this view on demand; checkpoints written before that kept one PodClaims per pod.
type PodClaims struct {
	Pod    PodRef        `json:"pod"`
	Claims []ClaimRecord `json:"claims"`
	// Containers are the pod's containers (restartable init containers first), so that the
	// PodResources service lists each claim under the right ones.
	Containers []ContainerClaims `json:"containers,omitempty"`
}

// Clone returns a deep copy of p.
func (p *PodClaims) Clone() PodClaims {
	c := PodClaims{Pod: p.Pod, Claims: slices.Clone(p.Claims), Containers: cloneContainers(p.Containers)}
	for i := range c.Claims {
		c.Claims[i].Drivers = slices.Clone(c.Claims[i].Drivers)
		c.Claims[i].Devices = cloneDevices(c.Claims[i].Devices)
	}
	return c
}

func cloneContainers(cs []ContainerClaims) []ContainerClaims {
	out := slices.Clone(cs)
	for i := range out {
		out[i].Claims = slices.Clone(out[i].Claims)
	}
	return out
}

// ClaimInfo is one ResourceClaim podgate holds for the pods of this node: one record per
// claim, however many pods use it, as the kubelet's DRA manager keeps one ClaimInfo per claim.
// It is recorded before any driver is called, so a crash never loses the obligation to
// unprepare it, and goes once the last pod using it is gone and its drivers unprepared it.
type ClaimInfo struct {
	UID       types.UID `json:"uid"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	// Drivers are the drivers podgate calls for the claim.
	Drivers []string `json:"drivers"`
	// Prepared: every driver prepared the claim; Devices holds what they returned.
	Prepared bool           `json:"prepared"`
	Devices  []DeviceRecord `json:"devices,omitempty"`
	// PreparedBy says who prepared it (PreparedByPodgate, PreparedByKubelet): podgate
	// unprepares only what it prepared. Empty while nobody has.
	PreparedBy string `json:"preparedBy,omitempty"`
	// PodUIDs are the pods of this node that use the claim, sorted; empty once they are all
	// gone and the claim waits for its unprepare.
	PodUIDs []types.UID `json:"podUIDs,omitempty"`
}

// Clone returns a deep copy of c.
func (c *ClaimInfo) Clone() ClaimInfo {
	out := *c
	out.Drivers = slices.Clone(c.Drivers)
	out.PodUIDs = slices.Clone(c.PodUIDs)
	out.Devices = cloneDevices(c.Devices)
	return out
}

func cloneDevices(devs []DeviceRecord) []DeviceRecord {
	out := slices.Clone(devs)
	for j := range out {
		out[j].Requests = slices.Clone(out[j].Requests)
		out[j].CDIDeviceIDs = slices.Clone(out[j].CDIDeviceIDs)
		if n := out[j].Network; n != nil {
			nc := *n
			nc.Addresses = slices.Clone(n.Addresses)
			out[j].Network = &nc
		}
	}
	return out
}

// Who prepared a claim.
const (
	// PreparedByPodgate: podgate called the drivers; it unprepares the claim after its last user.
	PreparedByPodgate = "podgate"
	// PreparedByKubelet: the kubelet's DRA manager prepared it; podgate recorded the devices of
	// its allocation and leaves the unprepare to the kubelet.
	PreparedByKubelet = "kubelet"
)

// PodClaimRef is one claim a pod uses, by UID, with the pod's name for it.
type PodClaimRef struct {
	UID types.UID `json:"uid"`
	// PodClaimName is the pod's name for the claim (spec.resourceClaims[].name).
	PodClaimName string `json:"podClaimName"`
}

// PodDRA is what one pod of the node uses of DRA: its claims, and its containers with the
// claims each uses. The claims themselves are ClaimInfos, shared by the pods using them.
type PodDRA struct {
	Pod        PodRef            `json:"pod"`
	Claims     []PodClaimRef     `json:"claims"`
	Containers []ContainerClaims `json:"containers,omitempty"`
}

// Clone returns a deep copy of p.
func (p *PodDRA) Clone() PodDRA {
	return PodDRA{Pod: p.Pod, Claims: slices.Clone(p.Claims), Containers: cloneContainers(p.Containers)}
}

// ClaimUse is one claim a pod starting now uses, as resolved from the API server.
type ClaimUse struct {
	UID          types.UID
	Namespace    string
	Name         string
	PodClaimName string
	Drivers      []string
}

// PodClaimsGetter returns the DRA claims of a pod.
type PodClaimsGetter interface {
	PodClaims(uid types.UID) (PodClaims, bool)
}

// PodClaims implements PodClaimsGetter: the pod's view of its claims, each with its shared
// state (prepared, devices).
func (r *Registry) PodClaims(uid types.UID) (PodClaims, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.podClaimsLocked(uid)
}

func (r *Registry) podClaimsLocked(uid types.UID) (PodClaims, bool) {
	p, ok := r.draPods[uid]
	if !ok {
		return PodClaims{}, false
	}
	pc := PodClaims{Pod: p.Pod, Containers: cloneContainers(p.Containers), Claims: make([]ClaimRecord, 0, len(p.Claims))}
	for _, ref := range p.Claims {
		c, ok := r.claimInfos[ref.UID]
		if !ok {
			continue // cannot be: a pod's claims are recorded with it
		}
		pc.Claims = append(pc.Claims, ClaimRecord{
			UID: c.UID, Namespace: c.Namespace, Name: c.Name, PodClaimName: ref.PodClaimName,
			Drivers: slices.Clone(c.Drivers), Prepared: c.Prepared, Devices: cloneDevices(c.Devices),
		})
	}
	return pc, true
}

// DRAPods returns what every pod of the node uses of DRA, ordered by pod UID.
func (r *Registry) DRAPods() []PodDRA {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PodDRA, 0, len(r.draPods))
	for _, p := range r.draPods {
		out = append(out, p.Clone())
	}
	slices.SortFunc(out, func(a, b PodDRA) int { return compareStrings(string(a.Pod.UID), string(b.Pod.UID)) })
	return out
}

// Claim returns the record of one claim.
func (r *Registry) Claim(uid types.UID) (ClaimInfo, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.claimInfos[uid]
	if !ok {
		return ClaimInfo{}, false
	}
	return c.Clone(), true
}

// Claims returns every claim's record, ordered by UID.
func (r *Registry) Claims() []ClaimInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.claimsLocked()
}

func (r *Registry) claimsLocked() []ClaimInfo {
	out := make([]ClaimInfo, 0, len(r.claimInfos))
	for _, c := range r.claimInfos {
		out = append(out, c.Clone())
	}
	slices.SortFunc(out, func(a, b ClaimInfo) int { return compareStrings(string(a.UID), string(b.UID)) })
	return out
}

func (r *Registry) draPodsLocked() []PodDRA {
	out := make([]PodDRA, 0, len(r.draPods))
	for _, p := range r.draPods {
		out = append(out, p.Clone())
	}
	slices.SortFunc(out, func(a, b PodDRA) int { return compareStrings(string(a.Pod.UID), string(b.Pod.UID)) })
	return out
}

// claimState is the DRA part of the registry as one change sees it: copies it may change.
type claimState struct {
	claims map[types.UID]*ClaimInfo
	pods   map[types.UID]*PodDRA
	// touched are the pods whose view of their claims the change may have changed.
	touched map[types.UID]bool
}

// touch notes that pod uid's view changed, and with a claim, every pod using it.
func (st *claimState) touch(uid types.UID, claim *ClaimInfo) {
	if uid != "" {
		st.touched[uid] = true
	}
	if claim != nil {
		for _, p := range claim.PodUIDs {
			st.touched[p] = true
		}
	}
}

// changeClaims applies fn to a copy of the claims and the pods using them, writes the
// checkpoint with the result, and only then makes it the registry's: readers, Watch clients
// and a later change see a change once it is on disk, and a change that cannot be written
// changes nothing. Changes are serialised by claimMu, so none is built on a state another one
// is replacing. fn returns false when it changed nothing (nothing is written).
func (r *Registry) changeClaims(fn func(st *claimState) (bool, error)) error {
	r.claimMu.Lock()
	defer r.claimMu.Unlock()
	r.mu.Lock()
	st := &claimState{claims: make(map[types.UID]*ClaimInfo, len(r.claimInfos)), pods: make(map[types.UID]*PodDRA, len(r.draPods)), touched: map[types.UID]bool{}}
	for uid, c := range r.claimInfos {
		cc := c.Clone()
		st.claims[uid] = &cc
	}
	for uid, p := range r.draPods {
		pc := p.Clone()
		st.pods[uid] = &pc
	}
	r.mu.Unlock()
	changed, err := fn(st)
	if err != nil || !changed {
		return err
	}
	if r.checkpoint != nil {
		// Held until the change is published: a background write in between would snapshot
		// the claims of before and overwrite this one.
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
		r.mu.Lock()
		snap := r.snapshotLocked()
		snap.Claims, snap.Pods = sortedClaims(st.claims), sortedPods(st.pods)
		r.mu.Unlock()
		if err := r.checkpoint.Write(snap); err != nil {
			return fmt.Errorf("pod registry: %w", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	uids := slices.Sorted(maps.Keys(st.touched))
	befores := make([]*PodState, len(uids))
	for i, uid := range uids {
		befores[i] = r.beforeLocked(uid)
	}
	r.claimInfos, r.draPods = st.claims, st.pods
	for i, uid := range uids {
		r.changedLocked(uid, befores[i])
	}
	return nil
}

func sortedClaims(m map[types.UID]*ClaimInfo) []ClaimInfo {
	out := make([]ClaimInfo, 0, len(m))
	for _, c := range m {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b ClaimInfo) int { return compareStrings(string(a.UID), string(b.UID)) })
	return out
}

func sortedPods(m map[types.UID]*PodDRA) []PodDRA {
	out := make([]PodDRA, 0, len(m))
	for _, p := range m {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b PodDRA) int { return compareStrings(string(a.Pod.UID), string(b.Pod.UID)) })
	return out
}

// UseClaims records that a pod uses claims, with its containers, before any driver is called
// for them: a claim not recorded yet is recorded unprepared with the pod as its first user; one
// recorded gains the pod as a user. It returns once the checkpoint holds it. Nothing is written
// when the registry already holds exactly this (a sandbox the kubelet re-creates).
func (r *Registry) UseClaims(pod PodRef, containers []ContainerClaims, claims []ClaimUse) error {
	return r.changeClaims(func(st *claimState) (bool, error) {
		changed := false
		p, ok := st.pods[pod.UID]
		if !ok {
			p = &PodDRA{Pod: pod}
			st.pods[pod.UID] = p
			changed = true
		}
		if !slices.EqualFunc(p.Containers, containers, func(a, b ContainerClaims) bool { return a.Name == b.Name && slices.Equal(a.Claims, b.Claims) }) {
			p.Containers = slices.Clone(containers)
			changed = true
		}
		for _, u := range claims {
			if i := slices.IndexFunc(p.Claims, func(c PodClaimRef) bool { return c.UID == u.UID }); i < 0 {
				p.Claims = append(p.Claims, PodClaimRef{UID: u.UID, PodClaimName: u.PodClaimName})
				changed = true
			} else if p.Claims[i].PodClaimName != u.PodClaimName {
				p.Claims[i].PodClaimName = u.PodClaimName
				changed = true
			}
			c, ok := st.claims[u.UID]
			if !ok {
				c = &ClaimInfo{UID: u.UID, Namespace: u.Namespace, Name: u.Name, Drivers: slices.Clone(u.Drivers)}
				st.claims[u.UID] = c
				changed = true
			}
			if i, found := slices.BinarySearch(c.PodUIDs, pod.UID); !found {
				c.PodUIDs = slices.Insert(c.PodUIDs, i, pod.UID)
				changed = true
			}
			st.touch(pod.UID, c)
		}
		return changed, nil
	})
}

// SetPrepared records the devices the drivers returned for claims podgate prepared; claims no
// longer recorded are left out. It returns once the checkpoint holds it.
func (r *Registry) SetPrepared(devices map[types.UID][]DeviceRecord) error {
	return r.setPrepared(devices, PreparedByPodgate)
}

// SetObserved records the devices of claims the kubelet prepared (from their allocation), unless
// podgate prepared them itself. It returns once the checkpoint holds it.
func (r *Registry) SetObserved(devices map[types.UID][]DeviceRecord) error {
	return r.setPrepared(devices, PreparedByKubelet)
}

func (r *Registry) setPrepared(devices map[types.UID][]DeviceRecord, by string) error {
	return r.changeClaims(func(st *claimState) (bool, error) {
		changed := false
		for uid, devs := range devices {
			c, ok := st.claims[uid]
			if !ok || (by == PreparedByKubelet && c.Prepared) {
				continue
			}
			c.Prepared, c.Devices, c.PreparedBy = true, cloneDevices(devs), by
			st.touch("", c)
			changed = true
		}
		return changed, nil
	})
}

// ReleasePod forgets that a pod uses its claims: the pod leaves each claim's users. It returns
// the claims that no pod uses any more — still recorded, as obligations to unprepare, until
// ClaimUnprepared — once the checkpoint holds it.
func (r *Registry) ReleasePod(uid types.UID) ([]ClaimInfo, error) {
	var unused []ClaimInfo
	err := r.changeClaims(func(st *claimState) (bool, error) {
		unused = nil
		p, ok := st.pods[uid]
		if !ok {
			return false, nil
		}
		st.touch(uid, nil)
		for _, ref := range p.Claims {
			c, ok := st.claims[ref.UID]
			if !ok {
				continue
			}
			st.touch("", c)
			if i, found := slices.BinarySearch(c.PodUIDs, uid); found {
				c.PodUIDs = slices.Delete(c.PodUIDs, i, i+1)
			}
			if len(c.PodUIDs) == 0 {
				unused = append(unused, c.Clone())
			}
		}
		delete(st.pods, uid)
		return true, nil
	})
	return unused, err
}

// ClaimUnprepared records that the drivers unprepared a claim: it is forgotten when no pod
// uses it, and kept unprepared when a pod took it up meanwhile (that pod prepares it again).
// The checkpoint follows before it returns.
func (r *Registry) ClaimUnprepared(uid types.UID) error {
	return r.changeClaims(func(st *claimState) (bool, error) {
		c, ok := st.claims[uid]
		if !ok {
			return false, nil
		}
		st.touch("", c)
		if len(c.PodUIDs) == 0 {
			delete(st.claims, uid)
			return true, nil
		}
		c.Prepared, c.Devices, c.PreparedBy = false, nil, ""
		return true, nil
	})
}

// ClaimUnprepareFailed records that the drivers' unprepare of a claim failed: a claim a pod
// took up meanwhile is kept unprepared, as its devices may be partly torn down, and that pod
// prepares it again; a claim no pod uses stays as it is, an obligation to unprepare. The
// checkpoint follows before it returns.
func (r *Registry) ClaimUnprepareFailed(uid types.UID) error {
	return r.changeClaims(func(st *claimState) (bool, error) {
		c, ok := st.claims[uid]
		if !ok || len(c.PodUIDs) == 0 || !c.Prepared {
			return false, nil
		}
		st.touch("", c)
		c.Prepared, c.Devices, c.PreparedBy = false, nil, ""
		return true, nil
	})
}

// migratePodClaims turns the claims of a checkpoint written by podgate before claims were kept
// one record per claim (a copy of each claim in every pod using it) into ClaimInfos and PodDRAs:
// a claim is prepared when some pod's copy says so, with that copy's devices.
func migratePodClaims(old []PodClaims) (map[types.UID]*ClaimInfo, map[types.UID]*PodDRA) {
	claims := map[types.UID]*ClaimInfo{}
	pods := map[types.UID]*PodDRA{}
	for _, pc := range old {
		p := &PodDRA{Pod: pc.Pod, Containers: slices.Clone(pc.Containers)}
		for _, cr := range pc.Claims {
			p.Claims = append(p.Claims, PodClaimRef{UID: cr.UID, PodClaimName: cr.PodClaimName})
			c, ok := claims[cr.UID]
			if !ok {
				c = &ClaimInfo{UID: cr.UID, Namespace: cr.Namespace, Name: cr.Name, Drivers: slices.Clone(cr.Drivers)}
				claims[cr.UID] = c
			}
			if cr.Prepared && !c.Prepared {
				c.Prepared, c.Devices, c.PreparedBy = true, cloneDevices(cr.Devices), PreparedByPodgate
			}
			if i, found := slices.BinarySearch(c.PodUIDs, pc.Pod.UID); !found {
				c.PodUIDs = slices.Insert(c.PodUIDs, i, pc.Pod.UID)
			}
		}
		pods[pc.Pod.UID] = p
	}
	return claims, pods
}

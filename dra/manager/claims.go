package manager

// The claim store: the DRA claims podgate holds for the node's pods, one record per claim, as
// the kubelet keeps cm/dra/claiminfo.go beside its DRA manager; its part of the registry's
// checkpoint.

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
)

// The claim store's data keys in the registry's checkpoint.
const (
	claimsKey  = "claims"
	draPodsKey = "draPods"
	// podClaimsKey is how a v1 checkpoint kept the claims: read and migrated, never written.
	podClaimsKey = "podClaims"
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

// PodClaims is one pod's view of its DRA claims: each claim's shared record with the pod's name
// for it, and the pod's containers. The store (one record per claim) builds it on demand;
// checkpoints written before that (v1) kept one PodClaims per pod.
type PodClaims struct {
	Pod    registry.PodRef `json:"pod"`
	Claims []ClaimRecord   `json:"claims"`
	// Containers are the pod's containers (restartable init containers first), so that the
	// PodResources service lists each claim under the right ones.
	Containers []ContainerClaims `json:"containers,omitempty"`
}

// CloneDevices returns a deep copy of devs.
func CloneDevices(devs []DeviceRecord) []DeviceRecord {
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

// CloneContainers returns a deep copy of cs.
func CloneContainers(cs []ContainerClaims) []ContainerClaims {
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
	out.Devices = CloneDevices(c.Devices)
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
	Pod        registry.PodRef   `json:"pod"`
	Claims     []PodClaimRef     `json:"claims"`
	Containers []ContainerClaims `json:"containers,omitempty"`
}

// Clone returns a deep copy of p.
func (p *PodDRA) Clone() PodDRA {
	return PodDRA{Pod: p.Pod, Claims: slices.Clone(p.Claims), Containers: CloneContainers(p.Containers)}
}

// ClaimUse is one claim a pod starting now uses, as resolved from the API server.
type ClaimUse struct {
	UID          types.UID
	Namespace    string
	Name         string
	PodClaimName string
	Drivers      []string
}

// Claims is the claim store: the claims and the pods using them, a section of the pod
// registry's checkpoint. A change (a pod taking up its claims, the drivers' answers, a pod
// gone, an unprepare) is made on a copy, written to the checkpoint, and only then made the
// store's (registry.Commit): readers, PodResources' Watch clients and the next change see it
// once it is durable, and a change that cannot be written changes nothing.
type Claims struct {
	reg *registry.Registry
	// changeMu serialises the changes (change): each is built on the state the one before it
	// left. Taken before the registry's locks; mu after them.
	changeMu sync.Mutex
	mu       sync.Mutex
	// claims and pods are replaced whole by a change, once the checkpoint holds the new ones.
	claims map[types.UID]*ClaimInfo
	pods   map[types.UID]*PodDRA
}

var (
	_ registry.Section   = (*Claims)(nil)
	_ registry.PodKeeper = (*Claims)(nil)
)

// NewClaims returns the claim store of reg, holding what reg's checkpoint held (a v1
// checkpoint's claims migrated). Build it before anything writes the checkpoint. A section that
// does not decode is an error naming the checkpoint as damaged.
func NewClaims(reg *registry.Registry) (*Claims, error) {
	c := &Claims{reg: reg, claims: map[types.UID]*ClaimInfo{}, pods: map[types.UID]*PodDRA{}}
	if err := reg.Register(c, c.load); err != nil {
		return nil, err
	}
	return c, nil
}

// load takes up the claims of the checkpoint: a v1 file's migrated, then the current ones.
func (c *Claims) load(l registry.Loaded) error {
	var old []PodClaims
	var claims []ClaimInfo
	var pods []PodDRA
	for key, v := range map[string]any{podClaimsKey: &old, claimsKey: &claims, draPodsKey: &pods} {
		if b, ok := l.Keys[key]; ok {
			if err := json.Unmarshal(b, v); err != nil {
				return fmt.Errorf("%s: %w", key, err)
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.claims, c.pods = migratePodClaims(old) // empty but for an older checkpoint
	for i := range claims {
		ci := claims[i].Clone()
		c.claims[ci.UID] = &ci
	}
	for i := range pods {
		p := pods[i].Clone()
		c.pods[p.Pod.UID] = &p
	}
	return nil
}

// Keys implements registry.Section.
func (c *Claims) Keys() []string { return []string{claimsKey, draPodsKey, podClaimsKey} }

// Save implements registry.Section: the published claims and pods (v2).
func (c *Claims) Save([]registry.SandboxRecord) (registry.Saved, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return encodeClaims(c.claims, c.pods)
}

// encodeClaims is the section's data for these claims and pods; an empty list is left out.
func encodeClaims(claims map[types.UID]*ClaimInfo, pods map[types.UID]*PodDRA) (registry.Saved, error) {
	out := map[string]json.RawMessage{}
	put := func(key string, n int, v any) error {
		if n == 0 {
			return nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		out[key] = b
		return nil
	}
	if err := put(claimsKey, len(claims), sortedClaims(claims)); err != nil {
		return registry.Saved{}, err
	}
	if err := put(draPodsKey, len(pods), sortedPods(pods)); err != nil {
		return registry.Saved{}, err
	}
	return registry.Saved{Keys: out, Version: 2}, nil
}

// PodClaims returns the pod's view of its claims, each with its shared state (prepared,
// devices).
func (c *Claims) PodClaims(uid types.UID) (PodClaims, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.podClaimsLocked(uid)
}

func (c *Claims) podClaimsLocked(uid types.UID) (PodClaims, bool) {
	p, ok := c.pods[uid]
	if !ok {
		return PodClaims{}, false
	}
	pc := PodClaims{Pod: p.Pod, Containers: CloneContainers(p.Containers), Claims: make([]ClaimRecord, 0, len(p.Claims))}
	for _, ref := range p.Claims {
		ci, ok := c.claims[ref.UID]
		if !ok {
			continue // cannot be: a pod's claims are recorded with it
		}
		pc.Claims = append(pc.Claims, ClaimRecord{
			UID: ci.UID, Namespace: ci.Namespace, Name: ci.Name, PodClaimName: ref.PodClaimName,
			Drivers: slices.Clone(ci.Drivers), Prepared: ci.Prepared, Devices: CloneDevices(ci.Devices),
		})
	}
	return pc, true
}

// ViewKey implements registry.PodViewer: the pods' view of their claims is named after the
// section's pods' key.
func (c *Claims) ViewKey() string { return draPodsKey }

// PodView implements registry.PodViewer: the pod's view of its claims (a PodClaims; InPod
// reads it), nil when it has none.
func (c *Claims) PodView(uid types.UID, _ []registry.SandboxRecord) any {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pc, ok := c.podClaimsLocked(uid); ok {
		return pc
	}
	return nil
}

// KeptPods implements registry.PodKeeper: the pods that have claims, known from the DRA stage
// on, before their sandbox exists (a meta-CNI plugin asks for their devices during CNI ADD).
func (c *Claims) KeptPods() []registry.PodRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]registry.PodRef, 0, len(c.pods))
	for _, p := range c.pods {
		out = append(out, p.Pod)
	}
	return out
}

// KeptPod implements registry.PodKeeper.
func (c *Claims) KeptPod(uid types.UID) (registry.PodRef, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pods[uid]; ok {
		return p.Pod, true
	}
	return registry.PodRef{}, false
}

// InPod returns a pod's view of its claims as the registry read it with the pod's state; false
// when the pod has none (or the claims' section is not registered).
func InPod(st *registry.PodState) (PodClaims, bool) {
	pc, ok := st.View(draPodsKey).(PodClaims)
	return pc, ok
}

// Pods returns what every pod of the node uses of DRA, ordered by pod UID.
func (c *Claims) Pods() []PodDRA {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := sortedPods(c.pods)
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out
}

// Claim returns the record of one claim.
func (c *Claims) Claim(uid types.UID) (ClaimInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ci, ok := c.claims[uid]
	if !ok {
		return ClaimInfo{}, false
	}
	return ci.Clone(), true
}

// List returns every claim's record, ordered by UID.
func (c *Claims) List() []ClaimInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := sortedClaims(c.claims)
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out
}

func sortedClaims(m map[types.UID]*ClaimInfo) []ClaimInfo {
	out := make([]ClaimInfo, 0, len(m))
	for _, c := range m {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b ClaimInfo) int { return strings.Compare(string(a.UID), string(b.UID)) })
	return out
}

func sortedPods(m map[types.UID]*PodDRA) []PodDRA {
	out := make([]PodDRA, 0, len(m))
	for _, p := range m {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b PodDRA) int { return strings.Compare(string(a.Pod.UID), string(b.Pod.UID)) })
	return out
}

// claimState is the store as one change sees it: copies it may change.
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

// change applies fn to a copy of the claims and the pods using them, writes the checkpoint
// with the result, and only then makes it the store's (registry.Commit), telling the registry's
// pod changes of the pods it touched. Changes are serialised by changeMu, so none is built on a
// state another one is replacing. fn returns false when it changed nothing (nothing is
// written).
func (c *Claims) change(fn func(st *claimState) (bool, error)) error {
	c.changeMu.Lock()
	defer c.changeMu.Unlock()
	c.mu.Lock()
	st := &claimState{claims: make(map[types.UID]*ClaimInfo, len(c.claims)), pods: make(map[types.UID]*PodDRA, len(c.pods)), touched: map[types.UID]bool{}}
	for uid, ci := range c.claims {
		cc := ci.Clone()
		st.claims[uid] = &cc
	}
	for uid, p := range c.pods {
		pc := p.Clone()
		st.pods[uid] = &pc
	}
	c.mu.Unlock()
	changed, err := fn(st)
	if err != nil || !changed {
		return err
	}
	next := func([]registry.SandboxRecord) (registry.Saved, error) {
		return encodeClaims(st.claims, st.pods)
	}
	publish := func() {
		c.mu.Lock()
		c.claims, c.pods = st.claims, st.pods
		c.mu.Unlock()
	}
	return c.reg.Commit(c, next, publish, slices.Sorted(maps.Keys(st.touched)))
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
				c.Prepared, c.Devices, c.PreparedBy = true, CloneDevices(cr.Devices), PreparedByPodgate
			}
			if i, found := slices.BinarySearch(c.PodUIDs, pc.Pod.UID); !found {
				c.PodUIDs = slices.Insert(c.PodUIDs, i, pc.Pod.UID)
			}
		}
		pods[pc.Pod.UID] = p
	}
	return claims, pods
}

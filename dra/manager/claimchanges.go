package manager

// The claim store's changes: each written to the checkpoint before it counts (Claims.change).

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
)

// UseClaims records that a pod uses claims, with its containers, before any driver is called
// for them: a claim not recorded yet is recorded unprepared with the pod as its first user; one
// recorded gains the pod as a user. It returns once the checkpoint holds it. Nothing is written
// when the store already holds exactly this (a sandbox the kubelet re-creates).
func (c *Claims) UseClaims(pod registry.PodRef, containers []ContainerClaims, claims []ClaimUse) error {
	return c.change(func(st *claimState) (bool, error) {
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
			ci, ok := st.claims[u.UID]
			if !ok {
				ci = &ClaimInfo{UID: u.UID, Namespace: u.Namespace, Name: u.Name, Drivers: slices.Clone(u.Drivers)}
				st.claims[u.UID] = ci
				changed = true
			}
			if i, found := slices.BinarySearch(ci.PodUIDs, pod.UID); !found {
				ci.PodUIDs = slices.Insert(ci.PodUIDs, i, pod.UID)
				changed = true
			}
			st.touch(pod.UID, ci)
		}
		return changed, nil
	})
}

// SetPrepared records the devices the drivers returned for claims podgate prepared; claims no
// longer recorded are left out. It returns once the checkpoint holds it.
func (c *Claims) SetPrepared(devices map[types.UID][]DeviceRecord) error {
	return c.setPrepared(devices, PreparedByPodgate)
}

// SetObserved records the devices of claims the kubelet prepared (from their allocation), unless
// podgate prepared them itself. It returns once the checkpoint holds it.
func (c *Claims) SetObserved(devices map[types.UID][]DeviceRecord) error {
	return c.setPrepared(devices, PreparedByKubelet)
}

func (c *Claims) setPrepared(devices map[types.UID][]DeviceRecord, by string) error {
	return c.change(func(st *claimState) (bool, error) {
		changed := false
		for uid, devs := range devices {
			ci, ok := st.claims[uid]
			if !ok || (by == PreparedByKubelet && ci.Prepared) {
				continue
			}
			ci.Prepared, ci.Devices, ci.PreparedBy = true, CloneDevices(devs), by
			st.touch("", ci)
			changed = true
		}
		return changed, nil
	})
}

// ReleasePod forgets that a pod uses its claims: the pod leaves each claim's users. It returns
// the claims that no pod uses any more — still recorded, as obligations to unprepare, until
// ClaimUnprepared — once the checkpoint holds it.
func (c *Claims) ReleasePod(uid types.UID) ([]ClaimInfo, error) {
	var unused []ClaimInfo
	err := c.change(func(st *claimState) (bool, error) {
		unused = nil
		p, ok := st.pods[uid]
		if !ok {
			return false, nil
		}
		st.touch(uid, nil)
		for _, ref := range p.Claims {
			ci, ok := st.claims[ref.UID]
			if !ok {
				continue
			}
			st.touch("", ci)
			if i, found := slices.BinarySearch(ci.PodUIDs, uid); found {
				ci.PodUIDs = slices.Delete(ci.PodUIDs, i, i+1)
			}
			if len(ci.PodUIDs) == 0 {
				unused = append(unused, ci.Clone())
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
func (c *Claims) ClaimUnprepared(uid types.UID) error {
	return c.change(func(st *claimState) (bool, error) {
		ci, ok := st.claims[uid]
		if !ok {
			return false, nil
		}
		st.touch("", ci)
		if len(ci.PodUIDs) == 0 {
			delete(st.claims, uid)
			return true, nil
		}
		ci.Prepared, ci.Devices, ci.PreparedBy = false, nil, ""
		return true, nil
	})
}

// ClaimUnprepareFailed records that the drivers' unprepare of a claim failed: a claim a pod
// took up meanwhile is kept unprepared, as its devices may be partly torn down, and that pod
// prepares it again; a claim no pod uses stays as it is, an obligation to unprepare. The
// checkpoint follows before it returns.
func (c *Claims) ClaimUnprepareFailed(uid types.UID) error {
	return c.change(func(st *claimState) (bool, error) {
		ci, ok := st.claims[uid]
		if !ok || len(ci.PodUIDs) == 0 || !ci.Prepared {
			return false, nil
		}
		st.touch("", ci)
		ci.Prepared, ci.Devices, ci.PreparedBy = false, nil, ""
		return true, nil
	})
}

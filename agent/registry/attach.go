package registry

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// AttachedDevice is a DRA device's host interface that podgate moved into a pod.
type AttachedDevice struct {
	ClaimNamespace string    `json:"claimNamespace"`
	ClaimName      string    `json:"claimName"`
	ClaimUID       types.UID `json:"claimUID"`
	Driver         string    `json:"driver"`
	Pool           string    `json:"pool"`
	Device         string    `json:"device"`
	// Interface is what giving it back needs.
	Interface AttachedInterface `json:"interface"`
	// Published: its network data is in the claim's status.
	Published bool `json:"published,omitempty"`
}

// AttachedInterface is what podgate needs to give a host interface back after moving it into
// a pod. It mirrors the DRA feature's record of an attach (dra.Attached) field by field and tag
// by tag, so that the registry imports no feature and the checkpoint keeps its form.
type AttachedInterface struct {
	// HostName is the interface's name on the host, the name it gets back.
	HostName string `json:"hostName"`
	// PodName is the interface's name in the pod.
	PodName string `json:"podName"`
	// MTU is the interface's MTU on the host, restored when it comes back; 0: leave as is.
	MTU int `json:"mtu,omitempty"`
	// Up records that the interface was administratively up on the host.
	Up bool `json:"up,omitempty"`
	// Alias is the interface's alias on the host, restored when it comes back: while the
	// interface is away, its alias is podgate's mark.
	Alias string `json:"alias,omitempty"`
	// HardwareAddr is the interface's MAC address, as the pod sees it.
	HardwareAddr string `json:"hardwareAddr,omitempty"`
	// Addresses are the addresses podgate gave the interface in the pod, in CIDR notation.
	Addresses []string `json:"addresses,omitempty"`
}

// AttachIntent is podgate's obligation for a DRA network device it is moving into a pod: the
// move (dra.Attach) cannot be undone by anything but podgate, so the intent is on disk before
// the move, as a claim's use is before its driver's prepare. It ends in one of three ways: the
// sandbox's record takes the device up as attached (Add, in the same write), the attach fails
// and the device is given back (EndAttach), or, left by a crash or by a give back that failed,
// it is settled later (SettleAttach or EndAttach).
type AttachIntent struct {
	SandboxID string `json:"sandboxID"`
	Pod       PodRef `json:"pod"`
	// NetNS is the pod's network namespace the device is moved into.
	NetNS          string    `json:"netns"`
	ClaimNamespace string    `json:"claimNamespace"`
	ClaimName      string    `json:"claimName"`
	ClaimUID       types.UID `json:"claimUID"`
	Driver         string    `json:"driver"`
	Pool           string    `json:"pool"`
	Device         string    `json:"device"`
	// HostInterface is the device's interface on the host: the name podgate's mark on the
	// interface carries while it is away (dra.Attach).
	HostInterface string `json:"hostInterface"`
	// Config is how the device is set up in the pod, to finish the attach after a crash.
	Config InterfaceConfig `json:"config"`
}

// InterfaceConfig is how a device's interface is set up in the pod. It mirrors the DRA
// feature's configuration of an interface (dra.InterfaceConfig) field by field and tag by tag,
// so that the registry imports no feature and the checkpoint keeps its form.
type InterfaceConfig struct {
	// Name is the interface's name in the pod; empty: it keeps its host name.
	Name string `json:"name,omitempty"`
	// MTU is the interface's MTU in the pod; 0 keeps the interface's MTU.
	MTU int `json:"mtu,omitempty"`
	// Addresses are the addresses to give the interface in the pod, in CIDR notation.
	Addresses []string `json:"addresses,omitempty"`
}

// Clone returns a deep copy of in.
func (in *AttachIntent) Clone() AttachIntent {
	c := *in
	c.Config.Addresses = slices.Clone(in.Config.Addresses)
	return c
}

// Attached is the record of the device once it is in the pod, with what giving it back needs.
func (in *AttachIntent) Attached(iface AttachedInterface) AttachedDevice {
	return AttachedDevice{
		ClaimNamespace: in.ClaimNamespace, ClaimName: in.ClaimName, ClaimUID: in.ClaimUID,
		Driver: in.Driver, Pool: in.Pool, Device: in.Device, Interface: iface,
	}
}

type attachKey struct{ sandbox, hostIf string }

// attachEntry is an intent and whether it is left: no RunPodSandbox call is at it any more
// (it was in the checkpoint at start-up, or its call ended without settling it).
type attachEntry struct {
	intent AttachIntent
	left   bool
}

// BeginAttach records the intent to move a device into a pod. It returns once the checkpoint
// holds it, and records nothing when the write fails: the caller must not move the device
// then.
func (r *Registry) BeginAttach(in AttachIntent) error {
	if in.SandboxID == "" || in.HostInterface == "" {
		return errors.New("registry: attach intent without a sandbox ID or a host interface")
	}
	c := in.Clone()
	key := attachKey{c.SandboxID, c.HostInterface}
	if r.checkpoint != nil {
		// Held until the intent is published: a background write in between would snapshot
		// the registry of before and overwrite this one.
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
		r.mu.Lock()
		snap := r.snapshotLocked()
		snap.Attaching = slices.DeleteFunc(snap.Attaching, func(a AttachIntent) bool { return a.SandboxID == key.sandbox && a.HostInterface == key.hostIf })
		snap.Attaching = append(snap.Attaching, c.Clone())
		slices.SortFunc(snap.Attaching, compareIntents)
		r.mu.Unlock()
		if err := r.checkpoint.Write(snap); err != nil {
			return fmt.Errorf("pod registry: %w", err)
		}
	}
	r.mu.Lock()
	r.attaching[key] = &attachEntry{intent: c}
	r.mu.Unlock()
	return nil
}

// EndAttach forgets the intent for hostIf in the sandbox: the device was given back (or never
// moved). The checkpoint follows in the background: an intent a crash keeps is settled again,
// and finds nothing to give back.
func (r *Registry) EndAttach(sandboxID, hostIf string) {
	r.mu.Lock()
	_, ok := r.attaching[attachKey{sandboxID, hostIf}]
	delete(r.attaching, attachKey{sandboxID, hostIf})
	r.mu.Unlock()
	if ok {
		r.persistSoon()
	}
}

// LeaveAttaches marks the sandbox's intents left: the call that wrote them ended without
// settling them (a give back failed), and SettleAttach or EndAttach must.
func (r *Registry) LeaveAttaches(sandboxID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, e := range r.attaching {
		if k.sandbox == sandboxID {
			e.left = true
		}
	}
}

// LeftAttaches returns the intents that are left, sorted by sandbox and host interface.
func (r *Registry) LeftAttaches() []AttachIntent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.intentsLocked(func(e *attachEntry) bool { return e.left })
}

// AttachIntents returns the sandbox's intents, left or not, sorted by host interface.
func (r *Registry) AttachIntents(sandboxID string) []AttachIntent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.intentsLocked(func(e *attachEntry) bool { return e.intent.SandboxID == sandboxID })
}

// HasAttachIntent reports whether the intent for hostIf in the sandbox is still recorded.
func (r *Registry) HasAttachIntent(sandboxID, hostIf string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.attaching[attachKey{sandboxID, hostIf}]
	return ok
}

// SettleAttach turns the intent for dev into dev recorded as attached in the sandbox's
// record, in one checkpoint write: a crash leaves either the intent or the record. It reports
// false, changing nothing, when the sandbox is not recorded; when the write fails it changes
// nothing either.
func (r *Registry) SettleAttach(sandboxID string, dev AttachedDevice) (bool, error) {
	key := attachKey{sandboxID, dev.Interface.HostName}
	settled := func(rec *SandboxRecord) {
		rec.Attached = slices.DeleteFunc(rec.Attached, func(a AttachedDevice) bool { return a.Interface.HostName == key.hostIf })
		rec.Attached = append(rec.Attached, dev)
	}
	if r.checkpoint != nil {
		r.persistMu.Lock()
		defer r.persistMu.Unlock()
	}
	r.mu.Lock()
	e, ok := r.entries[sandboxID]
	if !ok {
		r.mu.Unlock()
		return false, nil
	}
	if r.checkpoint != nil {
		rec := e.Clone()
		settled(&rec)
		snap := r.snapshotLocked()
		i := slices.IndexFunc(snap.Sandboxes, func(s SandboxRecord) bool { return s.ID == sandboxID })
		snap.Sandboxes[i] = rec
		snap.Attaching = slices.DeleteFunc(snap.Attaching, func(a AttachIntent) bool { return a.SandboxID == key.sandbox && a.HostInterface == key.hostIf })
		r.mu.Unlock()
		if err := r.checkpoint.Write(snap); err != nil {
			return false, fmt.Errorf("pod registry: %w", err)
		}
		r.mu.Lock()
		if e, ok = r.entries[sandboxID]; !ok {
			// Only Remove can take it meanwhile, and it leaves the record's devices as
			// intents; this one's is left too.
			if e, ok := r.attaching[key]; ok {
				e.left = true
			}
			r.mu.Unlock()
			return false, nil
		}
	}
	before := r.beforeLocked(e.Pod.UID)
	settled(e)
	delete(r.attaching, key)
	r.changedLocked(e.Pod.UID, before)
	r.mu.Unlock()
	return true, nil
}

// leaveAttachedLocked turns the devices a record going away holds as attached into left
// intents: the sandbox is gone from the registry, and nothing else would give them back.
func (r *Registry) leaveAttachedLocked(rec *SandboxRecord) {
	for _, dev := range rec.Attached {
		in := AttachIntent{
			SandboxID: rec.ID, Pod: rec.Pod, NetNS: rec.NetNS,
			ClaimNamespace: dev.ClaimNamespace, ClaimName: dev.ClaimName, ClaimUID: dev.ClaimUID,
			Driver: dev.Driver, Pool: dev.Pool, Device: dev.Device, HostInterface: dev.Interface.HostName,
			Config: InterfaceConfig{Name: dev.Interface.PodName, Addresses: slices.Clone(dev.Interface.Addresses)},
		}
		r.attaching[attachKey{rec.ID, in.HostInterface}] = &attachEntry{intent: in, left: true}
	}
}

// dropAttachedIntentsLocked forgets the intents of the devices rec holds as attached.
func (r *Registry) dropAttachedIntentsLocked(rec *SandboxRecord) {
	for _, dev := range rec.Attached {
		delete(r.attaching, attachKey{rec.ID, dev.Interface.HostName})
	}
}

func (r *Registry) intentsLocked(keep func(*attachEntry) bool) []AttachIntent {
	var out []AttachIntent
	for _, e := range r.attaching {
		if keep(e) {
			out = append(out, e.intent.Clone())
		}
	}
	slices.SortFunc(out, compareIntents)
	return out
}

func compareIntents(a, b AttachIntent) int {
	if c := compareStrings(a.SandboxID, b.SandboxID); c != 0 {
		return c
	}
	return compareStrings(a.HostInterface, b.HostInterface)
}

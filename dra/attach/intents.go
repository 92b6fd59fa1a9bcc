package attach

// The attach records: podgate's obligations for the devices it is moving into pods (the attach
// intents) and for those it moved (the devices attached to each sandbox), its section of the
// pod registry's checkpoint.

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra"
)

// The section's keys in the registry's checkpoint: the intents, top level, and the devices
// attached to a sandbox, in its sandbox object.
const (
	attachingKey = "attaching"
	attachedKey  = "attached"
)

// intentsVersion is the checkpoint format that holds intents (registry.CheckpointVersion).
const intentsVersion = 3

// Intent is podgate's obligation for a DRA network device it is moving into a pod: the
// move (dra.Attach) cannot be undone by anything but podgate, so the intent is on disk before
// the move, as a claim's use is before its driver's prepare. It ends in one of three ways: the
// device is recorded as attached to the sandbox once the registry records the sandbox
// (registry.Add, in the same write), the attach fails and the device is given back
// (EndAttach), or, left by a crash or by a give back that failed, it is settled later
// (SettleAttach or EndAttach).
type Intent struct {
	SandboxID string          `json:"sandboxID"`
	Pod       registry.PodRef `json:"pod"`
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
	Config dra.InterfaceConfig `json:"config"`
}

// Clone returns a deep copy of in.
func (in *Intent) Clone() Intent {
	c := *in
	c.Config.Addresses = slices.Clone(in.Config.Addresses)
	return c
}

// Attached is the record of the device once it is in the pod, with what giving it back needs.
func (in *Intent) Attached(iface dra.Attached) Device {
	return Device{
		ClaimNamespace: in.ClaimNamespace, ClaimName: in.ClaimName, ClaimUID: in.ClaimUID,
		Driver: in.Driver, Pool: in.Pool, Device: in.Device, Interface: iface,
	}
}

// Device is a DRA device's host interface that podgate moved into a pod: its record in the
// sandbox's object of the checkpoint ("attached"), from which the sandbox's stop gives it back.
type Device struct {
	ClaimNamespace string    `json:"claimNamespace"`
	ClaimName      string    `json:"claimName"`
	ClaimUID       types.UID `json:"claimUID"`
	Driver         string    `json:"driver"`
	Pool           string    `json:"pool"`
	Device         string    `json:"device"`
	// Interface is what giving it back needs.
	Interface dra.Attached `json:"interface"`
	// Published: its network data is in the claim's status.
	Published bool `json:"published,omitempty"`
}

// cloneDevices returns a deep copy of devs.
func cloneDevices(devs []Device) []Device {
	out := slices.Clone(devs)
	for i := range out {
		out[i].Interface.Addresses = slices.Clone(devs[i].Interface.Addresses)
	}
	return out
}

type intentKey struct{ sandbox, hostIf string }

// intentEntry is an intent and whether it is left: no RunPodSandbox call is at it any more
// (it was in the checkpoint at start-up, or its call ended without settling it).
type intentEntry struct {
	intent Intent
	left   bool
}

// Intents are the attach feature's records, its section of the pod registry's checkpoint: the
// attach intents, by sandbox and host interface (top level, "attaching"), and the devices
// attached to each sandbox (in its sandbox object, "attached"). An intent whose device is
// recorded as attached to a sandbox the checkpoint holds is not written (the device's record
// holds the obligation), so the write that records the sandbox with its devices drops their
// intents. The registry tells it of sandbox records set and gone, writes a sandbox that has
// attached devices before it counts (Obliged), and shows the devices with each pod (InPod
// reads them).
type Intents struct {
	reg *registry.Registry
	// mu is taken after the registry's locks, never before.
	mu sync.Mutex
	m  map[intentKey]*intentEntry
	// attached are the devices moved into each sandbox, by sandbox ID, in the order they were
	// attached. A sandbox's devices are written with its record, once the registry holds it.
	attached map[string][]Device
}

var (
	_ registry.SandboxFields  = (*Intents)(nil)
	_ registry.SandboxWatcher = (*Intents)(nil)
	_ registry.Obligations    = (*Intents)(nil)
	_ registry.PodViewer      = (*Intents)(nil)
)

// NewIntents returns the attach records of reg, holding those reg's checkpoint held: a crash's
// intents, left (no call of this podgate is at them), and the devices attached to each
// sandbox. Build it before anything writes the checkpoint. A record that does not decode is an
// error naming the checkpoint as damaged.
func NewIntents(reg *registry.Registry) (*Intents, error) {
	in := &Intents{reg: reg, m: map[intentKey]*intentEntry{}, attached: map[string][]Device{}}
	if err := reg.Register(in, in.load); err != nil {
		return nil, err
	}
	return in, nil
}

func (s *Intents) load(l registry.Loaded) error {
	var loaded []Intent
	if b, ok := l.Keys[attachingKey]; ok {
		if err := json.Unmarshal(b, &loaded); err != nil {
			return fmt.Errorf("%s: %w", attachingKey, err)
		}
	}
	attached := make(map[string][]Device, len(l.Fields))
	for id, f := range l.Fields {
		raw, ok := f[attachedKey]
		if !ok {
			continue
		}
		var devs []Device
		if err := json.Unmarshal(raw, &devs); err != nil {
			return fmt.Errorf("sandbox %s %s: %w", id, attachedKey, err)
		}
		if len(devs) > 0 {
			attached[id] = devs
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range loaded {
		in := loaded[i].Clone()
		s.m[intentKey{in.SandboxID, in.HostInterface}] = &intentEntry{intent: in, left: true}
	}
	s.attached = attached
	return nil
}

// Keys implements registry.Section.
func (s *Intents) Keys() []string { return []string{attachingKey} }

// Fields implements registry.SandboxFields.
func (s *Intents) Fields() []string { return []string{attachedKey} }

// Save implements registry.Section: the devices attached to the sandboxes, and the intents but
// those whose device is recorded as attached to one of sandboxes; v3 when there are any, else
// v2.
func (s *Intents) Save(sandboxes []registry.SandboxRecord) (registry.Saved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return encodeRecords(s.listLocked(func(*intentEntry) bool { return true }), s.attached, sandboxes)
}

func encodeRecords(intents []Intent, attached map[string][]Device, sandboxes []registry.SandboxRecord) (registry.Saved, error) {
	out := registry.Saved{Version: 2}
	written := make(map[string]bool, len(sandboxes))
	for i := range sandboxes {
		id := sandboxes[i].ID
		written[id] = true
		devs := attached[id]
		if len(devs) == 0 {
			continue
		}
		b, err := json.Marshal(devs)
		if err != nil {
			return registry.Saved{}, fmt.Errorf("sandbox %s %s: %w", id, attachedKey, err)
		}
		if out.Fields == nil {
			out.Fields = map[string]map[string]json.RawMessage{}
		}
		out.Fields[id] = map[string]json.RawMessage{attachedKey: b}
	}
	intents = slices.DeleteFunc(intents, func(in Intent) bool {
		return written[in.SandboxID] && holds(attached[in.SandboxID], in.HostInterface)
	})
	if len(intents) == 0 {
		return out, nil
	}
	b, err := json.Marshal(intents)
	if err != nil {
		return registry.Saved{}, fmt.Errorf("%s: %w", attachingKey, err)
	}
	out.Keys, out.Version = map[string]json.RawMessage{attachingKey: b}, intentsVersion
	return out, nil
}

// holds reports whether devs hold the device of host interface hostIf.
func holds(devs []Device, hostIf string) bool {
	return slices.ContainsFunc(devs, func(d Device) bool { return d.Interface.HostName == hostIf })
}

// SandboxSet implements registry.SandboxWatcher: the intents of the devices attached to the
// sandbox go, its record holding the obligation now.
func (s *Intents) SandboxSet(rec *registry.SandboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, dev := range s.attached[rec.ID] {
		delete(s.m, intentKey{rec.ID, dev.Interface.HostName})
	}
}

// SandboxGone implements registry.SandboxWatcher: the devices attached to a sandbox going away
// become left intents, as nothing else would give them back.
func (s *Intents) SandboxGone(rec *registry.SandboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, dev := range s.attached[rec.ID] {
		in := Intent{
			SandboxID: rec.ID, Pod: rec.Pod, NetNS: rec.NetNS,
			ClaimNamespace: dev.ClaimNamespace, ClaimName: dev.ClaimName, ClaimUID: dev.ClaimUID,
			Driver: dev.Driver, Pool: dev.Pool, Device: dev.Device, HostInterface: dev.Interface.HostName,
			Config: dra.InterfaceConfig{Name: dev.Interface.PodName, Addresses: slices.Clone(dev.Interface.Addresses)},
		}
		s.m[intentKey{rec.ID, in.HostInterface}] = &intentEntry{intent: in, left: true}
	}
	delete(s.attached, rec.ID)
}

// Obliged implements registry.Obligations: a sandbox with attached devices is recorded only
// once the checkpoint holds it with them.
func (s *Intents) Obliged(sandboxID string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.attached[sandboxID]) > 0
}

// ViewKey implements registry.PodViewer.
func (s *Intents) ViewKey() string { return attachedKey }

// PodView implements registry.PodViewer: the devices attached to the pod's sandboxes, by
// sandbox ID (a map[string][]Device; InPod reads it).
func (s *Intents) PodView(_ types.UID, sandboxes []registry.SandboxRecord) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out map[string][]Device
	for i := range sandboxes {
		if devs := s.attached[sandboxes[i].ID]; len(devs) > 0 {
			if out == nil {
				out = map[string][]Device{}
			}
			out[sandboxes[i].ID] = cloneDevices(devs)
		}
	}
	if out == nil {
		return nil
	}
	return out
}

// InPod returns the devices attached to a pod's sandboxes, by sandbox ID, as the registry read
// them with the pod's state; none when there are none (or the feature is not registered).
func InPod(st *registry.PodState) map[string][]Device {
	v, _ := st.View(attachedKey).(map[string][]Device)
	return v
}

// Attached returns the devices attached to the sandbox.
func (s *Intents) Attached(sandboxID string) []Device {
	s.mu.Lock()
	defer s.mu.Unlock()
	return cloneDevices(s.attached[sandboxID])
}

// setAttached records the devices a RunPodSandbox moved into its sandbox: they are written,
// and their intents dropped, with the sandbox's record (registry.Add, which writes it before it
// counts).
func (s *Intents) setAttached(sandboxID string, devs []Device) {
	c := cloneDevices(devs)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attached[sandboxID] = c
}

// keepAttached records that only kept of the sandbox's devices are still attached to it (the
// others were given back), its pod told of the change. The checkpoint follows in the
// background: a crash that loses this leaves the devices recorded as attached, and giving them
// back again finds nothing to move and succeeds (dra.Detach). A sandbox that is not recorded
// (its devices left as intents when it went) is left alone.
func (s *Intents) keepAttached(sandboxID string, kept []Device) {
	c := cloneDevices(kept)
	s.reg.ChangeSandbox(sandboxID, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(c) == 0 {
			delete(s.attached, sandboxID)
			return
		}
		s.attached[sandboxID] = c
	})
}

// forgetAttached forgets the devices of a RunPodSandbox that failed after its attach (those it
// could not give back keep their intents).
func (s *Intents) forgetAttached(sandboxID string) {
	drop := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.attached, sandboxID)
	}
	if !s.reg.ChangeSandbox(sandboxID, drop) {
		drop() // not recorded: nobody sees them
	}
}

// BeginAttach records the intent to move a device into a pod. It returns once the checkpoint
// holds it, and records nothing when the write fails: the caller must not move the device
// then.
func (s *Intents) BeginAttach(in Intent) error {
	if in.SandboxID == "" || in.HostInterface == "" {
		return errors.New("registry: attach intent without a sandbox ID or a host interface")
	}
	c := in.Clone()
	key := intentKey{c.SandboxID, c.HostInterface}
	next := func(sandboxes []registry.SandboxRecord) (registry.Saved, error) {
		s.mu.Lock()
		intents := s.listLocked(func(e *intentEntry) bool {
			return e.intent.SandboxID != key.sandbox || e.intent.HostInterface != key.hostIf
		})
		attached := maps.Clone(s.attached)
		s.mu.Unlock()
		intents = append(intents, c.Clone())
		slices.SortFunc(intents, compareIntents)
		return encodeRecords(intents, attached, sandboxes)
	}
	publish := func() {
		s.mu.Lock()
		s.m[key] = &intentEntry{intent: c}
		s.mu.Unlock()
	}
	return s.reg.Commit(s, next, publish, nil)
}

// EndAttach forgets the intent for hostIf in the sandbox: the device was given back (or never
// moved). The checkpoint follows in the background: an intent a crash keeps is settled again,
// and finds nothing to give back.
func (s *Intents) EndAttach(sandboxID, hostIf string) {
	s.mu.Lock()
	_, ok := s.m[intentKey{sandboxID, hostIf}]
	delete(s.m, intentKey{sandboxID, hostIf})
	s.mu.Unlock()
	if ok {
		s.reg.PersistSoon()
	}
}

// LeaveAttaches marks the sandbox's intents left: the call that wrote them ended without
// settling them (a give back failed), and SettleAttach or EndAttach must.
func (s *Intents) LeaveAttaches(sandboxID string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.m {
		if k.sandbox == sandboxID {
			e.left = true
		}
	}
}

// LeftAttaches returns the intents that are left, sorted by sandbox and host interface.
func (s *Intents) LeftAttaches() []Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listLocked(func(e *intentEntry) bool { return e.left })
}

// AttachIntents returns the sandbox's intents, left or not, sorted by host interface.
func (s *Intents) AttachIntents(sandboxID string) []Intent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listLocked(func(e *intentEntry) bool { return e.intent.SandboxID == sandboxID })
}

// HasAttachIntent reports whether the intent for hostIf in the sandbox is still recorded.
func (s *Intents) HasAttachIntent(sandboxID, hostIf string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[intentKey{sandboxID, hostIf}]
	return ok
}

// SettleAttach turns the intent for dev into dev recorded as attached to the sandbox, in one
// checkpoint write (registry.CommitSandbox: the write that holds the device drops its intent):
// a crash leaves either the intent or the device's record. It reports false, changing nothing,
// when the sandbox is not recorded; when the write fails it changes nothing either.
func (s *Intents) SettleAttach(sandboxID string, dev Device) (bool, error) {
	hostIf := dev.Interface.HostName
	with := func(devs []Device) []Device {
		out := slices.DeleteFunc(cloneDevices(devs), func(a Device) bool { return a.Interface.HostName == hostIf })
		return append(out, cloneDevices([]Device{dev})...)
	}
	next := func(sandboxes []registry.SandboxRecord) (registry.Saved, error) {
		s.mu.Lock()
		intents := s.listLocked(func(*intentEntry) bool { return true })
		attached := maps.Clone(s.attached)
		s.mu.Unlock()
		attached[sandboxID] = with(attached[sandboxID])
		return encodeRecords(intents, attached, sandboxes)
	}
	publish := func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.attached[sandboxID] = with(s.attached[sandboxID])
		delete(s.m, intentKey{sandboxID, hostIf})
	}
	ok, err := s.reg.CommitSandbox(s, sandboxID, next, publish)
	if err == nil && !ok {
		// Only Remove can take the record meanwhile, and it leaves the sandbox's devices as
		// intents; this one's is left too.
		s.mu.Lock()
		if e, found := s.m[intentKey{sandboxID, hostIf}]; found {
			e.left = true
		}
		s.mu.Unlock()
	}
	return ok, err
}

func (s *Intents) listLocked(keep func(*intentEntry) bool) []Intent {
	var out []Intent
	for _, e := range s.m {
		if keep(e) {
			out = append(out, e.intent.Clone())
		}
	}
	slices.SortFunc(out, compareIntents)
	return out
}

func compareIntents(a, b Intent) int {
	if c := strings.Compare(a.SandboxID, b.SandboxID); c != 0 {
		return c
	}
	return strings.Compare(a.HostInterface, b.HostInterface)
}

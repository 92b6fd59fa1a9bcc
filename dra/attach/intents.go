package attach

// The attach intents: podgate's obligations for the devices it is moving into pods, its
// section of the pod registry's checkpoint.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
)

// attachingKey is the intents' data key in the registry's checkpoint.
const attachingKey = "attaching"

// intentsVersion is the checkpoint format that holds intents (registry.CheckpointVersion).
const intentsVersion = 3

// Intent is podgate's obligation for a DRA network device it is moving into a pod: the
// move (dra.Attach) cannot be undone by anything but podgate, so the intent is on disk before
// the move, as a claim's use is before its driver's prepare. It ends in one of three ways: the
// sandbox's record takes the device up as attached (registry.Add, in the same write), the
// attach fails and the device is given back (EndAttach), or, left by a crash or by a give back
// that failed, it is settled later (SettleAttach or EndAttach).
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
	Config InterfaceConfig `json:"config"`
}

// InterfaceConfig is how a device's interface is set up in the pod, as an intent records it. It
// mirrors dra.InterfaceConfig field by field and tag by tag (TestRecordsMirrorDRA), so that the
// checkpoint keeps its form whatever dra's type grows.
type InterfaceConfig struct {
	// Name is the interface's name in the pod; empty: it keeps its host name.
	Name string `json:"name,omitempty"`
	// MTU is the interface's MTU in the pod; 0 keeps the interface's MTU.
	MTU int `json:"mtu,omitempty"`
	// Addresses are the addresses to give the interface in the pod, in CIDR notation.
	Addresses []string `json:"addresses,omitempty"`
}

// Clone returns a deep copy of in.
func (in *Intent) Clone() Intent {
	c := *in
	c.Config.Addresses = slices.Clone(in.Config.Addresses)
	return c
}

// Attached is the record of the device once it is in the pod, with what giving it back needs.
func (in *Intent) Attached(iface registry.AttachedInterface) registry.AttachedDevice {
	return registry.AttachedDevice{
		ClaimNamespace: in.ClaimNamespace, ClaimName: in.ClaimName, ClaimUID: in.ClaimUID,
		Driver: in.Driver, Pool: in.Pool, Device: in.Device, Interface: iface,
	}
}

type intentKey struct{ sandbox, hostIf string }

// intentEntry is an intent and whether it is left: no RunPodSandbox call is at it any more
// (it was in the checkpoint at start-up, or its call ended without settling it).
type intentEntry struct {
	intent Intent
	left   bool
}

// Intents are the attach intents, by sandbox and host interface: a section of the pod
// registry's checkpoint, which the registry tells of sandbox records set and gone. An intent
// whose device a sandbox record holds as attached is not written (the record holds the
// obligation), so the write that records the device drops the intent.
type Intents struct {
	reg *registry.Registry
	// mu is taken after the registry's locks, never before.
	mu sync.Mutex
	m  map[intentKey]*intentEntry
}

var (
	_ registry.Section        = (*Intents)(nil)
	_ registry.SandboxWatcher = (*Intents)(nil)
)

// NewIntents returns the attach intents of reg, holding those reg's checkpoint held: a crash's,
// left (no call of this podgate is at them). Build it before anything writes the checkpoint. A
// section that does not decode is an error naming the checkpoint as damaged.
func NewIntents(reg *registry.Registry) (*Intents, error) {
	in := &Intents{reg: reg, m: map[intentKey]*intentEntry{}}
	if err := reg.Register(in, in.load); err != nil {
		return nil, err
	}
	return in, nil
}

func (s *Intents) load(raw map[string]json.RawMessage) error {
	b, ok := raw[attachingKey]
	if !ok {
		return nil
	}
	var loaded []Intent
	if err := json.Unmarshal(b, &loaded); err != nil {
		return fmt.Errorf("%s: %w", attachingKey, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range loaded {
		in := loaded[i].Clone()
		s.m[intentKey{in.SandboxID, in.HostInterface}] = &intentEntry{intent: in, left: true}
	}
	return nil
}

// Keys implements registry.Section.
func (s *Intents) Keys() []string { return []string{attachingKey} }

// Save implements registry.Section: the intents but those whose device a record of sandboxes
// holds as attached; v3 when there are any, else nothing (v2).
func (s *Intents) Save(sandboxes []registry.SandboxRecord) (map[string]json.RawMessage, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return encodeIntents(s.listLocked(func(*intentEntry) bool { return true }), sandboxes)
}

func encodeIntents(intents []Intent, sandboxes []registry.SandboxRecord) (map[string]json.RawMessage, int, error) {
	intents = slices.DeleteFunc(intents, func(in Intent) bool { return heldAsAttached(sandboxes, in) })
	if len(intents) == 0 {
		return nil, 2, nil
	}
	b, err := json.Marshal(intents)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", attachingKey, err)
	}
	return map[string]json.RawMessage{attachingKey: b}, intentsVersion, nil
}

// heldAsAttached reports whether a record of sandboxes holds in's device as attached.
func heldAsAttached(sandboxes []registry.SandboxRecord, in Intent) bool {
	for i := range sandboxes {
		if sandboxes[i].ID == in.SandboxID {
			return slices.ContainsFunc(sandboxes[i].Attached, func(a registry.AttachedDevice) bool { return a.Interface.HostName == in.HostInterface })
		}
	}
	return false
}

// SandboxSet implements registry.SandboxWatcher: the intents of the devices rec holds as
// attached go, the record holding the obligation now.
func (s *Intents) SandboxSet(rec *registry.SandboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, dev := range rec.Attached {
		delete(s.m, intentKey{rec.ID, dev.Interface.HostName})
	}
}

// SandboxGone implements registry.SandboxWatcher: the devices a record going away holds as
// attached become left intents, as nothing else would give them back.
func (s *Intents) SandboxGone(rec *registry.SandboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, dev := range rec.Attached {
		in := Intent{
			SandboxID: rec.ID, Pod: rec.Pod, NetNS: rec.NetNS,
			ClaimNamespace: dev.ClaimNamespace, ClaimName: dev.ClaimName, ClaimUID: dev.ClaimUID,
			Driver: dev.Driver, Pool: dev.Pool, Device: dev.Device, HostInterface: dev.Interface.HostName,
			Config: InterfaceConfig{Name: dev.Interface.PodName, Addresses: slices.Clone(dev.Interface.Addresses)},
		}
		s.m[intentKey{rec.ID, in.HostInterface}] = &intentEntry{intent: in, left: true}
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
	next := func(sandboxes []registry.SandboxRecord) (map[string]json.RawMessage, int, error) {
		s.mu.Lock()
		intents := s.listLocked(func(e *intentEntry) bool {
			return e.intent.SandboxID != key.sandbox || e.intent.HostInterface != key.hostIf
		})
		s.mu.Unlock()
		intents = append(intents, c.Clone())
		slices.SortFunc(intents, compareIntents)
		return encodeIntents(intents, sandboxes)
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

// SettleAttach turns the intent for dev into dev recorded as attached in the sandbox's
// record, in one checkpoint write (registry.UpdateDurable: the write that holds the device
// drops its intent): a crash leaves either the intent or the record. It reports false, changing
// nothing, when the sandbox is not recorded; when the write fails it changes nothing either.
func (s *Intents) SettleAttach(sandboxID string, dev registry.AttachedDevice) (bool, error) {
	hostIf := dev.Interface.HostName
	ok, err := s.reg.UpdateDurable(sandboxID, func(rec *registry.SandboxRecord) {
		rec.Attached = slices.DeleteFunc(rec.Attached, func(a registry.AttachedDevice) bool { return a.Interface.HostName == hostIf })
		rec.Attached = append(rec.Attached, dev)
	})
	if err == nil && !ok {
		// Only Remove can take the record meanwhile, and it leaves the record's devices as
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

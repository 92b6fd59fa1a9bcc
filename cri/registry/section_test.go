package registry

import (
	"encoding/json"
	"errors"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// noteSection is a section of one key holding a list of notes, each of a pod; it asks for v3
// while it holds a note marked so. It records what the registry tells it.
type noteSection struct {
	key string
	mu  sync.Mutex
	// notes are by pod UID.
	notes map[types.UID]string
	// saved are the sandboxes of the last Save; set and gone the records told.
	saved      []SandboxRecord
	set, gone  []string
	loaded     map[string]json.RawMessage
	failToLoad error
	// as is the section registered (the noteSection itself unless a wrapper is).
	as Section
}

func newNoteSection(key string) *noteSection {
	return &noteSection{key: key, notes: map[types.UID]string{}}
}

func (s *noteSection) Keys() []string { return []string{s.key} }

func (s *noteSection) Save(sandboxes []SandboxRecord) (map[string]json.RawMessage, int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saved = slices.Clone(sandboxes)
	return encodeNotes(s.key, s.notes)
}

func encodeNotes(key string, notes map[types.UID]string) (map[string]json.RawMessage, int, error) {
	if len(notes) == 0 {
		return nil, checkpointV2, nil
	}
	b, err := json.Marshal(notes)
	if err != nil {
		return nil, 0, err
	}
	v := checkpointV2
	if slices.Contains(slices.Collect(maps.Values(notes)), "v3") {
		v = checkpointV3
	}
	return map[string]json.RawMessage{key: b}, v, nil
}

func (s *noteSection) load(raw map[string]json.RawMessage) error {
	if s.failToLoad != nil {
		return s.failToLoad
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loaded = raw
	if b, ok := raw[s.key]; ok {
		return json.Unmarshal(b, &s.notes)
	}
	return nil
}

func (s *noteSection) SandboxSet(rec *SandboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.set = append(s.set, rec.ID)
}

func (s *noteSection) SandboxGone(rec *SandboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gone = append(s.gone, rec.ID)
}

// note changes the note of pod uid, durable before it counts (Commit).
func (s *noteSection) note(reg *Registry, uid types.UID, text string) error {
	s.mu.Lock()
	next := maps.Clone(s.notes)
	s.mu.Unlock()
	next[uid] = text
	as := s.as
	if as == nil {
		as = s
	}
	return reg.Commit(as, func([]SandboxRecord) (map[string]json.RawMessage, int, error) { return encodeNotes(s.key, next) },
		func() { s.mu.Lock(); s.notes = next; s.mu.Unlock() }, []types.UID{uid})
}

func (s *noteSection) get(uid types.UID) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.notes[uid]
	return n, ok
}

// claimSource is a noteSection that shows each note as the pod's claim of that name.
type claimSource struct{ *noteSection }

func (c claimSource) PodClaims(uid types.UID) (PodClaims, bool) {
	n, ok := c.get(uid)
	if !ok {
		return PodClaims{}, false
	}
	return PodClaims{Pod: PodRef{UID: uid, Name: string(uid), Namespace: "ns"}, Claims: []ClaimRecord{{Name: n}}}, true
}

func (c claimSource) ClaimPods() []PodRef {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []PodRef
	for uid := range c.notes {
		out = append(out, PodRef{UID: uid, Name: string(uid), Namespace: "ns"})
	}
	return out
}

func readData(t *testing.T, cp *Checkpoint) CheckpointData {
	t.Helper()
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestRegisterHandsTheLoadedKeys: a section is handed what the checkpoint held under its keys,
// and only that; a section whose data does not load is not registered, and the error names the
// checkpoint as damaged; two sections cannot own one key.
func TestRegisterHandsTheLoadedKeys(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	d := CheckpointData{Sections: map[string]json.RawMessage{"notes": json.RawMessage(`{"uid-a":"hello"}`), "other": json.RawMessage(`[1]`)}}
	reg := NewRegistry(cp, d)
	s := newNoteSection("notes")
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	if len(s.loaded) != 1 || string(s.loaded["notes"]) != `{"uid-a":"hello"}` {
		t.Errorf("handed %s, want the notes key alone", s.loaded)
	}
	if n, _ := s.get("uid-a"); n != "hello" {
		t.Errorf("loaded note %q, want hello", n)
	}
	if err := reg.Register(newNoteSection("notes"), func(map[string]json.RawMessage) error { return nil }); err == nil {
		t.Error("a second section of the key registered")
	}
	bad := newNoteSection("other")
	bad.failToLoad = errors.New("not notes")
	if err := reg.Register(bad, bad.load); err == nil || !strings.Contains(err.Error(), cp.Path()) || !strings.Contains(err.Error(), "damaged") || !strings.Contains(err.Error(), "not notes") {
		t.Errorf("Register of a section that does not load: %v, want an error naming %s as damaged", err, cp.Path())
	}
	// Not registered: its key is carried as it was.
	reg.PersistSoon()
	reg.Flush()
	if got := readData(t, cp).Sections["other"]; string(got) != `[1]` {
		t.Errorf("key of the section that did not load written as %s, want [1]", got)
	}
}

// TestUnknownKeysCarriedThrough: data keys no section owns are written back unchanged, by
// background writes, durable writes (Add of a record with attached devices) and commits; a
// section's key is written as the section saves it.
func TestUnknownKeysCarriedThrough(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	future := json.RawMessage(`{"from":"a later podgate","n":[1,2,3]}`)
	reg := NewRegistry(cp, CheckpointData{Sections: map[string]json.RawMessage{"future": future}})
	reg.SetWriteDelay(time.Hour)
	check := func(when string) {
		t.Helper()
		if got := readData(t, cp).Sections["future"]; string(got) != string(future) {
			t.Errorf("%s: unknown key written as %s, want %s", when, got, future)
		}
	}
	if err := reg.Add(sampleRecord("a")); err != nil {
		t.Fatal(err)
	}
	reg.Flush()
	check("background write")
	attached := sampleRecord("b")
	attached.Attached = []AttachedDevice{{ClaimUID: "claim-1", Interface: AttachedInterface{HostName: "veth7"}}}
	if err := reg.Add(attached); err != nil {
		t.Fatal(err)
	}
	check("durable Add")
	s := newNoteSection("notes")
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	if err := s.note(reg, "uid-a", "hello"); err != nil {
		t.Fatal(err)
	}
	check("commit")
	if got := readData(t, cp).Sections["notes"]; string(got) != `{"uid-a":"hello"}` {
		t.Errorf("section written as %s", got)
	}
}

// TestFailedCommitPublishesNothing: a commit whose write fails returns the error, and neither
// the section nor the pod views change; once the file can be written, the next commit holds
// the change.
func TestFailedCommitPublishesNothing(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	reg := NewRegistry(cp, CheckpointData{})
	s := claimSource{newNoteSection("notes")}
	s.as = s
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	var told []*PodState
	reg.OnPodChange(func(_ uint64, _, after *PodState) { told = append(told, after) })
	if err := os.Mkdir(cp.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := s.note(reg, "uid-a", "hello"); err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Fatalf("commit with the checkpoint not writable: %v, want its failure", err)
	}
	if _, ok := s.get("uid-a"); ok {
		t.Error("the section's change counts although it is not on disk")
	}
	if _, ok := reg.PodClaims("uid-a"); ok || len(told) != 0 {
		t.Errorf("pod view after the failed commit: %t, told %d changes; want nothing", ok, len(told))
	}
	if err := os.Remove(cp.Path()); err != nil {
		t.Fatal(err)
	}
	if err := s.note(reg, "uid-a", "hello"); err != nil {
		t.Fatal(err)
	}
	if pc, ok := reg.PodClaims("uid-a"); !ok || pc.Claims[0].Name != "hello" || len(told) != 1 || told[0].Claims == nil {
		t.Errorf("pod view after the commit: %+v %t, told %+v; want the claim hello, told once", pc, ok, told)
	}
	if got := readData(t, cp).Sections["notes"]; string(got) != `{"uid-a":"hello"}` {
		t.Errorf("section on disk %s", got)
	}
}

// TestVersionV3WhileASectionAsksForIt: the file is v3 exactly while a section saves data that
// needs it, and v2 before and after; data of a section this podgate lacks keeps its file's
// version.
func TestVersionV3WhileASectionAsksForIt(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	reg := NewRegistry(cp, CheckpointData{})
	s := newNoteSection("notes")
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	version := func() int { t.Helper(); return readData(t, cp).Version }
	for _, step := range []struct {
		note string
		want int
	}{{"v2", checkpointV2}, {"v3", checkpointV3}, {"v2 again", checkpointV2}} {
		if err := s.note(reg, "uid-a", step.note); err != nil {
			t.Fatal(err)
		}
		if v := version(); v != step.want {
			t.Errorf("after note %q: file version %d, want %d", step.note, v, step.want)
		}
	}

	// A v3 file's data no registered section owns: written as v3 still.
	dir := t.TempDir()
	old := NewCheckpoint(dir)
	if err := old.Write(CheckpointData{Sections: map[string]json.RawMessage{"attaching": json.RawMessage(`[{"sandboxID":"sb"}]`)}, Version: checkpointV3}); err != nil {
		t.Fatal(err)
	}
	lacking := NewRegistry(old, readData(t, old))
	lacking.PersistSoon()
	lacking.Flush()
	if d := readData(t, old); d.Version != checkpointV3 || string(d.Sections["attaching"]) != `[{"sandboxID":"sb"}]` {
		t.Errorf("rewritten by a podgate lacking the section: version %d, %s; want v3 with the data", d.Version, d.Sections["attaching"])
	}
}

// TestWatchersToldOfRecords: a section watching sandboxes is told of a record set (Add,
// UpdateDurable) and gone (Remove), and saves for the checkpoint the sandboxes it is written
// with, the new record included in a durable write.
func TestWatchersToldOfRecords(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	reg := NewRegistry(cp, CheckpointData{})
	reg.SetWriteDelay(time.Hour)
	s := newNoteSection("notes")
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	if err := reg.Add(sampleRecord("a")); err != nil {
		t.Fatal(err)
	}
	ok, err := reg.UpdateDurable("a", func(r *SandboxRecord) {
		r.Attached = []AttachedDevice{{ClaimUID: "claim-1", Interface: AttachedInterface{HostName: "veth7"}}}
	})
	if !ok || err != nil {
		t.Fatalf("UpdateDurable: %t, %v", ok, err)
	}
	if len(s.saved) != 1 || len(s.saved[0].Attached) != 1 {
		t.Errorf("the durable write saved the section with sandboxes %+v, want a with its device", s.saved)
	}
	if d := readData(t, cp); len(d.Sandboxes) != 1 || len(d.Sandboxes[0].Attached) != 1 {
		t.Errorf("checkpoint when UpdateDurable returned: %+v", d.Sandboxes)
	}
	if ok, err := reg.UpdateDurable("nope", func(*SandboxRecord) {}); ok || err != nil {
		t.Errorf("UpdateDurable of a sandbox not recorded: %t, %v; want false, nil", ok, err)
	}
	reg.Remove("a")
	if !slices.Equal(s.set, []string{"a", "a"}) || !slices.Equal(s.gone, []string{"a"}) {
		t.Errorf("told set %v, gone %v; want a set twice (Add, UpdateDurable) and gone once", s.set, s.gone)
	}
	reg.Flush()
}

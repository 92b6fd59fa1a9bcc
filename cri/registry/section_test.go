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
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
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
	loaded     Loaded
	failToLoad error
	// as is the section registered (the noteSection itself unless a wrapper is).
	as Section
}

func newNoteSection(key string) *noteSection {
	return &noteSection{key: key, notes: map[types.UID]string{}}
}

func (s *noteSection) Keys() []string { return []string{s.key} }

func (s *noteSection) Save(sandboxes []SandboxRecord) (Saved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.saved = slices.Clone(sandboxes)
	return encodeNotes(s.key, s.notes)
}

func encodeNotes(key string, notes map[types.UID]string) (Saved, error) {
	if len(notes) == 0 {
		return Saved{Version: checkpointV2}, nil
	}
	b, err := json.Marshal(notes)
	if err != nil {
		return Saved{}, err
	}
	v := checkpointV2
	if slices.Contains(slices.Collect(maps.Values(notes)), "v3") {
		v = checkpointV3
	}
	return Saved{Keys: map[string]json.RawMessage{key: b}, Version: v}, nil
}

func (s *noteSection) load(l Loaded) error {
	if s.failToLoad != nil {
		return s.failToLoad
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loaded = l
	if b, ok := l.Keys[s.key]; ok {
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
	return reg.Commit(as, func([]SandboxRecord) (Saved, error) { return encodeNotes(s.key, next) },
		func() { s.mu.Lock(); s.notes = next; s.mu.Unlock() }, []types.UID{uid})
}

func (s *noteSection) get(uid types.UID) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.notes[uid]
	return n, ok
}

// keeperSection is a noteSection whose notes make their pods known, as the DRA claims do, and
// show with them.
type keeperSection struct{ *noteSection }

var _ PodKeeper = keeperSection{}

func (k keeperSection) ViewKey() string { return k.key }

func (k keeperSection) PodView(uid types.UID, _ []SandboxRecord) any {
	if n, ok := k.get(uid); ok {
		return n
	}
	return nil
}

func (k keeperSection) KeptPods() []PodRef {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []PodRef
	for uid := range k.notes {
		out = append(out, PodRef{UID: uid, Name: string(uid), Namespace: "ns"})
	}
	return out
}

func (k keeperSection) KeptPod(uid types.UID) (PodRef, bool) {
	_, ok := k.get(uid)
	return PodRef{UID: uid, Name: string(uid), Namespace: "ns"}, ok
}

// fieldSection keeps a note per sandbox in the sandbox's object under its key, as a feature
// keeps its records of each sandbox; a note "oblige" is an obligation, and an adopted sandbox
// gets a note of its runtime configuration's hostname.
type fieldSection struct {
	key string
	mu  sync.Mutex
	// notes are by sandbox ID.
	notes map[string]string
}

var (
	_ SandboxFields = (*fieldSection)(nil)
	_ Obligations   = (*fieldSection)(nil)
	_ PodViewer     = (*fieldSection)(nil)
	_ AdoptWatcher  = (*fieldSection)(nil)
)

func newFieldSection(t *testing.T, reg *Registry, key string) *fieldSection {
	t.Helper()
	s := &fieldSection{key: key, notes: map[string]string{}}
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *fieldSection) Keys() []string   { return nil }
func (s *fieldSection) Fields() []string { return []string{s.key} }
func (s *fieldSection) ViewKey() string  { return s.key }

func (s *fieldSection) Save(sandboxes []SandboxRecord) (Saved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := Saved{Fields: map[string]map[string]json.RawMessage{}}
	for _, sb := range sandboxes {
		if n, ok := s.notes[sb.ID]; ok {
			b, err := json.Marshal(n)
			if err != nil {
				return Saved{}, err
			}
			out.Fields[sb.ID] = map[string]json.RawMessage{s.key: b}
		}
	}
	return out, nil
}

func (s *fieldSection) load(l Loaded) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, f := range l.Fields {
		var n string
		if err := json.Unmarshal(f[s.key], &n); err != nil {
			return err
		}
		s.notes[id] = n
	}
	return nil
}

func (s *fieldSection) Obliged(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notes[id] == "oblige"
}

func (s *fieldSection) PodView(_ types.UID, sandboxes []SandboxRecord) any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]string{}
	for _, sb := range sandboxes {
		if n, ok := s.notes[sb.ID]; ok {
			out[sb.ID] = n
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

func (s *fieldSection) SandboxAdopted(rec *SandboxRecord, cfg *runtimeapi.PodSandboxConfig) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notes[rec.ID] = "adopted " + cfg.GetHostname()
}

// set notes sandbox id's note, not telling the registry (before the sandbox is recorded).
func (s *fieldSection) set(id, note string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notes[id] = note
}

func (s *fieldSection) get(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notes[id]
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
	if len(s.loaded.Keys) != 1 || string(s.loaded.Keys["notes"]) != `{"uid-a":"hello"}` || len(s.loaded.Fields) != 0 {
		t.Errorf("handed %+v, want the notes key alone", s.loaded)
	}
	if n, _ := s.get("uid-a"); n != "hello" {
		t.Errorf("loaded note %q, want hello", n)
	}
	if err := reg.Register(newNoteSection("notes"), func(Loaded) error { return nil }); err == nil {
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

// TestRegisterRefusesTheRegistrysKeys: no section owns "sandboxes" or a key of the registry's
// own sandbox record, and two sections do not own one sandbox key.
func TestRegisterRefusesTheRegistrysKeys(t *testing.T) {
	reg := NewRegistry(nil, CheckpointData{})
	if err := reg.Register(newNoteSection(sandboxesKey), func(Loaded) error { return nil }); err == nil {
		t.Error(`a section owns "sandboxes"`)
	}
	for _, key := range []string{"id", "pod", "netns", "status"} {
		s := &fieldSection{key: key, notes: map[string]string{}}
		if err := reg.Register(s, s.load); err == nil {
			t.Errorf("a section owns the record's key %q", key)
		}
	}
	newFieldSection(t, reg, "sysctls")
	s := &fieldSection{key: "sysctls", notes: map[string]string{}}
	if err := reg.Register(s, s.load); err == nil {
		t.Error("a second section of a sandbox key registered")
	}
}

// TestUnknownKeysCarriedThrough: data keys no section owns are written back unchanged, by
// background writes, durable writes (Add of a record a section holds an obligation in) and
// commits; a section's key is written as the section saves it.
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
	devices := newFieldSection(t, reg, "attached")
	devices.set("b", "oblige")
	if err := reg.Add(sampleRecord("b")); err != nil {
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

// TestSandboxFieldsLoadedAndCarried: each sandbox's keys beside the registry's own go to the
// section that owns them, per sandbox; those no section owns are carried through writes and go
// with their sandbox. The fields are written after the record's keys, sysctls before attached
// (as podgate wrote them when the registry held them), then the others by name.
func TestSandboxFieldsLoadedAndCarried(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	d := CheckpointData{
		Sandboxes: []SandboxRecord{sampleRecord("a"), sampleRecord("b")},
		SandboxFields: map[string]map[string]json.RawMessage{
			"a": {"sysctls": json.RawMessage(`"a's"`), "attached": json.RawMessage(`["eth5"]`), "zNext": json.RawMessage(`{"n":1}`), "qos": json.RawMessage(`"guaranteed"`)},
			"b": {"sysctls": json.RawMessage(`"b's"`)},
		},
	}
	if err := cp.Write(d); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(cp.Path())
	if err != nil {
		t.Fatal(err)
	}
	wantA := `"ips":["10.88.0.7"],"sysctls":"a's","attached":["eth5"],"qos":"guaranteed","zNext":{"n":1}}`
	if !strings.Contains(string(raw), wantA) {
		t.Fatalf("sandbox a written as\n%s\nwant its fields in the order\n%s", raw, wantA)
	}

	reg := NewRegistry(cp, readData(t, cp))
	sysctls := newFieldSection(t, reg, "sysctls")
	if got := sysctls.get("a") + "," + sysctls.get("b"); got != "a's,b's" {
		t.Errorf("sysctls loaded per sandbox as %q, want a's,b's", got)
	}
	// The attached devices' section is not registered (a podgate without it): carried.
	reg.PersistSoon()
	reg.Flush()
	if again, _ := os.ReadFile(cp.Path()); string(again) != string(raw) {
		t.Errorf("written back as\n%s\nwant\n%s", again, raw)
	}
	reg.Remove("a")
	reg.Flush()
	if d := readData(t, cp); d.SandboxFields["a"] != nil || string(d.SandboxFields["b"]["sysctls"]) != `"b's"` {
		t.Errorf("after a went, the fields are %s", d.SandboxFields)
	}
}

// TestFailedCommitPublishesNothing: a commit whose write fails returns the error, and neither
// the section nor the pod views change; once the file can be written, the next commit holds
// the change.
func TestFailedCommitPublishesNothing(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	reg := NewRegistry(cp, CheckpointData{})
	s := keeperSection{newNoteSection("notes")}
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
	if _, ok := reg.Pod("uid-a"); ok || len(told) != 0 {
		t.Errorf("pod view after the failed commit: %t, told %d changes; want nothing", ok, len(told))
	}
	if err := os.Remove(cp.Path()); err != nil {
		t.Fatal(err)
	}
	if err := s.note(reg, "uid-a", "hello"); err != nil {
		t.Fatal(err)
	}
	if st, ok := reg.Pod("uid-a"); !ok || st.View("notes") != "hello" || st.Ref().Name != "uid-a" || len(told) != 1 || told[0].View("notes") != "hello" {
		t.Errorf("pod after the commit: %+v %t, told %+v; want the pod kept by its note hello, told once", st, ok, told)
	}
	if pods, _ := reg.Pods(); len(pods) != 1 || pods[0].Ref().Name != "uid-a" {
		t.Errorf("Pods: %+v, want the pod kept by its note", pods)
	}
	if st, ok := reg.PodByName("ns", "uid-a"); !ok || st.UID != "uid-a" {
		t.Errorf("PodByName: %+v %t, want the pod kept by its note", st, ok)
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

// TestWatchersToldOfRecords: a section watching sandboxes is told of a record set (Add) and
// gone (Remove, or gone from the runtime), of one the rebuild adopts with the runtime's
// configuration, and saves for the checkpoint the sandboxes it is written with.
func TestWatchersToldOfRecords(t *testing.T) {
	reg := NewRegistry(NewCheckpoint(t.TempDir()), CheckpointData{})
	reg.SetWriteDelay(time.Hour)
	s := newNoteSection("notes")
	if err := reg.Register(s, s.load); err != nil {
		t.Fatal(err)
	}
	adopting := newFieldSection(t, reg, "sysctls")
	for _, id := range []string{"a", "b"} {
		if err := reg.Add(sampleRecord(id)); err != nil {
			t.Fatal(err)
		}
	}
	reg.Remove("a")
	seen := inRuntime(sampleRecord("c"))
	seen[0].config = &runtimeapi.PodSandboxConfig{Hostname: "c-host"}
	if added, dropped := reg.reconcile(seen, nil); added != 1 || dropped != 1 {
		t.Errorf("reconcile added %d, dropped %d; want c added, b dropped", added, dropped)
	}
	reg.Flush()
	if !slices.Equal(s.set, []string{"a", "b"}) || !slices.Equal(s.gone, []string{"a", "b"}) {
		t.Errorf("told set %v, gone %v; want a and b set, then gone", s.set, s.gone)
	}
	if n := adopting.get("c"); n != "adopted c-host" {
		t.Errorf("adopted sandbox's note %q, want the runtime's configuration's", n)
	}
	if len(s.saved) != 1 || s.saved[0].ID != "c" {
		t.Errorf("the last write saved the section with sandboxes %+v, want c", s.saved)
	}
}

// TestObligedRecordIsDurableBeforeItCounts: a sandbox record a section holds an obligation in
// (devices podgate attached to the pod) is on disk, with the section's record of it, when Add
// returns (nothing else finds those devices after a crash), and not recorded at all when it
// cannot be written; a record without any waits for the background write as before.
func TestObligedRecordIsDurableBeforeItCounts(t *testing.T) {
	dir := t.TempDir()
	reg := NewRegistry(NewCheckpoint(dir), CheckpointData{})
	reg.SetWriteDelay(time.Hour) // only Add's own write, or Flush, writes during the test
	devices := newFieldSection(t, reg, "attached")
	if err := reg.Add(sampleRecord("plain")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(reg.checkpoint.Path()); !os.IsNotExist(err) {
		t.Fatalf("a record without obligations was written at once: %v", err)
	}
	devices.set("net", "oblige")
	if err := reg.Add(sampleRecord("net")); err != nil {
		t.Fatal(err)
	}
	d := readData(t, reg.checkpoint)
	if len(d.Sandboxes) != 2 || d.Sandboxes[0].ID != "net" || string(d.SandboxFields["net"]["attached"]) != `"oblige"` {
		t.Fatalf("checkpoint when Add returned: %+v %s; want both sandboxes, net with its section's record", d.Sandboxes, d.SandboxFields)
	}

	// The checkpoint cannot be written: the record is refused and not recorded.
	if err := os.Remove(reg.checkpoint.Path()); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(reg.checkpoint.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	devices.set("net2", "oblige")
	if err := reg.Add(sampleRecord("net2")); err == nil || !strings.Contains(err.Error(), "pod registry") {
		t.Errorf("Add with the checkpoint not writable: %v, want its failure", err)
	}
	if _, ok := reg.Sandbox("net2"); ok {
		t.Error("a record with an obligation counts although it is not on disk")
	}
	if err := os.Remove(reg.checkpoint.Path()); err != nil {
		t.Fatal(err)
	}
	reg.Flush()
}

// TestCommitSandbox: a durable change of a section's record of one sandbox is on disk when it
// is published, and the sandbox's pod is told of it; it publishes nothing when the sandbox is
// not recorded, nor when the write fails.
func TestCommitSandbox(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	reg := NewRegistry(cp, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("a")}})
	reg.SetWriteDelay(time.Hour)
	devices := newFieldSection(t, reg, "attached")
	var told []string
	reg.OnPodChange(func(_ uint64, before, after *PodState) {
		told = append(told, string(after.UID)+":"+after.View("attached").(map[string]string)["a"])
		if before.View("attached") != nil {
			t.Errorf("state before the change shows %v, want nothing", before.View("attached"))
		}
	})
	commit := func(id string) (bool, error) {
		next := func([]SandboxRecord) (Saved, error) {
			return Saved{Fields: map[string]map[string]json.RawMessage{id: {"attached": json.RawMessage(`"eth5"`)}}}, nil
		}
		return reg.CommitSandbox(devices, id, next, func() { devices.set(id, "eth5") })
	}
	if ok, err := commit("nope"); ok || err != nil || devices.get("nope") != "" {
		t.Errorf("CommitSandbox of a sandbox not recorded: %t, %v; want false, nothing published", ok, err)
	}
	if err := os.Mkdir(cp.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if ok, err := commit("a"); ok || err == nil || devices.get("a") != "" {
		t.Errorf("CommitSandbox with the checkpoint not writable: %t, %v; want its failure, nothing published", ok, err)
	}
	if err := os.Remove(cp.Path()); err != nil {
		t.Fatal(err)
	}
	if ok, err := commit("a"); !ok || err != nil {
		t.Fatalf("CommitSandbox: %t, %v", ok, err)
	}
	if d := readData(t, cp); string(d.SandboxFields["a"]["attached"]) != `"eth5"` {
		t.Errorf("checkpoint when CommitSandbox returned: %s", d.SandboxFields)
	}
	if !slices.Equal(told, []string{"uid-a:eth5"}) {
		t.Errorf("told %v, want pod uid-a's change once", told)
	}
}

// TestChangeSandboxShowsInThePodState: a section's change of its record of a sandbox is told as
// a change of the sandbox's pod, the section's view before and after it; the checkpoint follows
// in the background; a sandbox not recorded is not changed.
func TestChangeSandboxShowsInThePodState(t *testing.T) {
	cp := NewCheckpoint(t.TempDir())
	reg := NewRegistry(cp, CheckpointData{Sandboxes: []SandboxRecord{sampleRecord("a")}})
	reg.SetWriteDelay(time.Hour)
	sysctls := newFieldSection(t, reg, "sysctls")
	sysctls.set("a", "pending")
	var views [][2]any
	reg.OnPodChange(func(_ uint64, before, after *PodState) {
		views = append(views, [2]any{before.View("sysctls"), after.View("sysctls")})
	})
	if !reg.ChangeSandbox("a", func() { sysctls.set("a", "ok") }) {
		t.Fatal("ChangeSandbox of a recorded sandbox: false")
	}
	if len(views) != 1 || views[0][0].(map[string]string)["a"] != "pending" || views[0][1].(map[string]string)["a"] != "ok" {
		t.Errorf("told %v, want the view from pending to ok", views)
	}
	if reg.ChangeSandbox("nope", func() { t.Error("publish called for a sandbox not recorded") }) {
		t.Error("ChangeSandbox of a sandbox not recorded: true")
	}
	reg.Flush()
	if d := readData(t, cp); string(d.SandboxFields["a"]["sysctls"]) != `"ok"` {
		t.Errorf("checkpoint after the change: %s", d.SandboxFields)
	}
	states, _ := reg.Pods()
	if len(states) != 1 || states[0].View("sysctls").(map[string]string)["a"] != "ok" {
		t.Errorf("Pods: %+v, want a's note ok", states)
	}
}

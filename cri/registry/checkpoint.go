package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// CheckpointVersion is the format of the pod registry's checkpoint file: v3 adds the intents to
// attach DRA network devices (package attach's section, "attaching") to v2, which keeps one
// record per DRA claim (package manager's section, "claims" and "draPods"). A v2 file is a v3
// file without intents; a v1 file (a copy of each claim in every pod using it, "podClaims") is
// read and migrated by the claims' section; a file of another version is refused, not guessed
// at.
//
// A checkpoint no section needs v3 for is written as v2, which a podgate before v3 reads: one
// put back starts, and refuses the file only while an attach is under way or left by a crash,
// whose intents it would not know of.
const CheckpointVersion = "podgate.dev/registry/v3"

// checkpointVersionV2 is the format before attach intents, still written when there are none.
const checkpointVersionV2 = "podgate.dev/registry/v2"

// checkpointVersionV1 is the format before one record per claim, migrated when read.
const checkpointVersionV1 = "podgate.dev/registry/v1"

// The formats as numbers (CheckpointData.Version).
const (
	checkpointV1 = 1
	checkpointV2 = 2
	checkpointV3 = 3
)

// CheckpointFile is the registry checkpoint's name in stateDir.
const CheckpointFile = "registry.json"

// Checkpoint is the pod registry's file in stateDir. It is written whole, atomically (a
// temporary file, fsync, rename, fsync of the directory), so a crash leaves either the old or
// the new file, and carries a checksum so that a damaged file is detected instead of read as
// an empty registry.
type Checkpoint struct {
	path string
}

// CheckpointData is what the checkpoint holds: the sandboxes, and each feature's section (the
// DRA claims podgate holds, one record each, and what each pod uses of them; the DRA network
// devices podgate is moving into pods; each sandbox's sysctl results and attached devices),
// kept raw: the features decode their own.
type CheckpointData struct {
	Sandboxes []SandboxRecord
	// SandboxFields are the keys of each sandbox object beside the registry's own, raw, by
	// sandbox ID then key: the features' records of the sandbox ("sysctls", "attached").
	SandboxFields map[string]map[string]json.RawMessage
	// Sections are the data keys beside "sandboxes", raw.
	Sections map[string]json.RawMessage
	// Version is the format: read, the file's (1, 2 or 3); written, 3 for v3, else v2.
	Version int
}

// sandboxFieldOrder is the order of the features' keys in each sandbox object, after the
// registry's own keys (SandboxRecord's, in its order): the order podgate wrote them in when
// the registry held them itself, so that the same state makes the same bytes whoever owns
// the keys. A key not listed (a later podgate's) comes after these, keys by name.
var sandboxFieldOrder = []string{"sysctls", "attached"}

// MarshalJSON writes the data object: "sandboxes" first, each sandbox's own keys then its
// fields (sandboxFieldOrder), then the sections by key.
func (d CheckpointData) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteString(`{"sandboxes":[`)
	for i := range d.Sandboxes {
		if i > 0 {
			buf.WriteByte(',')
		}
		if err := writeSandbox(&buf, &d.Sandboxes[i], d.SandboxFields[d.Sandboxes[i].ID]); err != nil {
			return nil, err
		}
	}
	buf.WriteByte(']')
	for _, k := range slices.Sorted(maps.Keys(d.Sections)) {
		if k == sandboxesKey {
			continue
		}
		if err := writeKey(&buf, k, d.Sections[k]); err != nil {
			return nil, fmt.Errorf("section %q: %w", k, err)
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// writeSandbox writes one sandbox object: the record's keys, then its fields.
func writeSandbox(buf *bytes.Buffer, rec *SandboxRecord, fields map[string]json.RawMessage) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if len(fields) == 0 {
		buf.Write(b)
		return nil
	}
	buf.Write(b[:len(b)-1]) // the record's object, still open
	for _, k := range fieldOrder(fields) {
		if err := writeKey(buf, k, fields[k]); err != nil {
			return fmt.Errorf("sandbox %s key %q: %w", rec.ID, k, err)
		}
	}
	buf.WriteByte('}')
	return nil
}

// fieldOrder is the order fields' keys are written in: sandboxFieldOrder, then the others by
// name.
func fieldOrder(fields map[string]json.RawMessage) []string {
	out := make([]string, 0, len(fields))
	for _, k := range sandboxFieldOrder {
		if _, ok := fields[k]; ok {
			out = append(out, k)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		if !slices.Contains(sandboxFieldOrder, k) {
			out = append(out, k)
		}
	}
	return out
}

// writeKey writes ,"k":raw into an object being written.
func writeKey(buf *bytes.Buffer, k string, raw json.RawMessage) error {
	kb, err := json.Marshal(k)
	if err != nil {
		return err
	}
	buf.WriteByte(',')
	buf.Write(kb)
	buf.WriteByte(':')
	return json.Compact(buf, raw)
}

// UnmarshalJSON reads the data object: the sandboxes, each one's keys that are not the
// registry's raw, and every other key raw. Version is left as it is (the file's, not the
// data's).
func (d *CheckpointData) UnmarshalJSON(b []byte) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return err
	}
	d.Sandboxes, d.SandboxFields = nil, nil
	if raw, ok := keys[sandboxesKey]; ok {
		if err := d.readSandboxes(raw); err != nil {
			return fmt.Errorf("sandboxes: %w", err)
		}
		delete(keys, sandboxesKey)
	}
	d.Sections = keys
	return nil
}

func (d *CheckpointData) readSandboxes(raw json.RawMessage) error {
	var objs []json.RawMessage
	if err := json.Unmarshal(raw, &objs); err != nil {
		return err
	}
	if objs == nil {
		return nil // null, as podgate never wrote it
	}
	d.Sandboxes = make([]SandboxRecord, len(objs))
	for i, obj := range objs {
		if err := json.Unmarshal(obj, &d.Sandboxes[i]); err != nil {
			return err
		}
		var all map[string]json.RawMessage
		if err := json.Unmarshal(obj, &all); err != nil {
			return err
		}
		for _, k := range recordKeys() {
			delete(all, k)
		}
		if len(all) == 0 {
			continue
		}
		if d.SandboxFields == nil {
			d.SandboxFields = map[string]map[string]json.RawMessage{}
		}
		d.SandboxFields[d.Sandboxes[i].ID] = all
	}
	return nil
}

// recordKeys are the keys of a sandbox object that are the registry's own: SandboxRecord's.
var recordKeys = sync.OnceValue(func() []string {
	var keys []string
	t := reflect.TypeFor[SandboxRecord]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		keys = append(keys, name)
	}
	return keys
})

// checkpointFile is the file's layout. Data is kept raw so the checksum covers the very bytes
// on disk.
type checkpointFile struct {
	Version  string          `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// NewCheckpoint returns the checkpoint at dir/CheckpointFile.
func NewCheckpoint(dir string) *Checkpoint {
	return &Checkpoint{path: filepath.Join(dir, CheckpointFile)}
}

// Path is the checkpoint file's path.
func (c *Checkpoint) Path() string { return c.path }

// Read returns the sandbox records in the checkpoint; see ReadAll.
func (c *Checkpoint) Read() ([]SandboxRecord, error) {
	d, err := c.ReadAll()
	return d.Sandboxes, err
}

// ReadAll returns what the checkpoint holds; nothing when the file does not exist. A file that
// cannot be read, is of an unknown version or fails its checksum is an error naming the file:
// podgate does not start from a silently emptied registry, which would lose its obligations to
// unprepare DRA claims.
func (c *Checkpoint) ReadAll() (CheckpointData, error) {
	b, err := os.ReadFile(c.path)
	if errors.Is(err, fs.ErrNotExist) {
		return CheckpointData{}, nil
	}
	if err != nil {
		return CheckpointData{}, fmt.Errorf("checkpoint: %w", err)
	}
	var f checkpointFile
	if err := json.Unmarshal(b, &f); err != nil {
		return CheckpointData{}, c.corrupt(err.Error())
	}
	if f.Version != CheckpointVersion && f.Version != checkpointVersionV2 && f.Version != checkpointVersionV1 {
		return CheckpointData{}, c.corrupt(fmt.Sprintf("version %q, want %q (or %q, %q, migrated)", f.Version, CheckpointVersion, checkpointVersionV2, checkpointVersionV1))
	}
	if got := checksum(f.Data); got != f.Checksum {
		return CheckpointData{}, c.corrupt(fmt.Sprintf("checksum %s, file says %s", got, f.Checksum))
	}
	var d CheckpointData
	if err := json.Unmarshal(f.Data, &d); err != nil {
		return CheckpointData{}, c.corrupt(err.Error())
	}
	d.Version = map[string]int{checkpointVersionV1: checkpointV1, checkpointVersionV2: checkpointV2, CheckpointVersion: checkpointV3}[f.Version]
	return d, nil
}

func (c *Checkpoint) corrupt(why string) error {
	return fmt.Errorf("checkpoint %s is damaged (%s): move it away to start with a registry rebuilt from the runtime alone", c.path, why)
}

// Write replaces the checkpoint with d, as v3 when d.Version says so, else as v2.
func (c *Checkpoint) Write(d CheckpointData) error {
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	version := checkpointVersionV2
	if d.Version >= checkpointV3 {
		version = CheckpointVersion
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	if err := enc.Encode(checkpointFile{Version: version, Checksum: checksum(data), Data: data}); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	return writeFileAtomic(c.path, buf.Bytes())
}

func checksum(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// writeFileAtomic writes data to path so that a crash leaves the old file or the new one,
// never a mix: a temporary file in the same directory, fsync, rename, fsync of the directory.
func writeFileAtomic(path string, data []byte) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name()) // the error being returned says what went wrong
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("checkpoint: sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("checkpoint: sync %s: %w", dir, err)
	}
	return nil
}

package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// CheckpointVersion is the format of the pod registry's checkpoint file: v3 adds the intents to
// attach DRA network devices (AttachIntent) to v2, which keeps one record per DRA claim. A v2
// file is a v3 file without intents; a v1 file (a copy of each claim in every pod using it) is
// read and migrated; a file of another version is refused, not guessed at.
//
// A checkpoint without intents is written as v2, which a podgate before v3 reads: one put back
// starts, and refuses the file only while an attach is under way or left by a crash, whose
// intents it would not know of.
const CheckpointVersion = "podgate.dev/registry/v3"

// checkpointVersionV2 is the format before attach intents, still written when there are none.
const checkpointVersionV2 = "podgate.dev/registry/v2"

// checkpointVersionV1 is the format before one record per claim, migrated when read.
const checkpointVersionV1 = "podgate.dev/registry/v1"

// CheckpointFile is the registry checkpoint's name in stateDir.
const CheckpointFile = "registry.json"

// Checkpoint is the pod registry's file in stateDir. It is written whole, atomically (a
// temporary file, fsync, rename, fsync of the directory), so a crash leaves either the old or
// the new file, and carries a checksum so that a damaged file is detected instead of read as
// an empty registry.
type Checkpoint struct {
	path string
}

// CheckpointData is what the checkpoint holds: the sandboxes, the DRA claims podgate holds
// (its obligations to unprepare them), one record each, what each pod uses of them, and the
// DRA network devices podgate is moving into pods (its obligations to give them back).
type CheckpointData struct {
	Sandboxes []SandboxRecord `json:"sandboxes"`
	Claims    []ClaimInfo     `json:"claims,omitempty"`
	Pods      []PodDRA        `json:"draPods,omitempty"`
	Attaching []AttachIntent  `json:"attaching,omitempty"`
	// PodClaims is how a v1 checkpoint kept the claims: read for the migration, never written.
	PodClaims []PodClaims `json:"podClaims,omitempty"`
}

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
	return d, nil
}

func (c *Checkpoint) corrupt(why string) error {
	return fmt.Errorf("checkpoint %s is damaged (%s): move it away to start with a registry rebuilt from the runtime alone", c.path, why)
}

// Write replaces the checkpoint with d.
func (c *Checkpoint) Write(d CheckpointData) error {
	if d.Sandboxes == nil {
		d.Sandboxes = []SandboxRecord{}
	}
	if len(d.PodClaims) > 0 {
		claims, pods := migratePodClaims(d.PodClaims)
		d.Claims, d.Pods, d.PodClaims = append(d.Claims, sortedClaims(claims)...), append(d.Pods, sortedPods(pods)...), nil
	}
	data, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("checkpoint: %w", err)
	}
	version := checkpointVersionV2
	if len(d.Attaching) > 0 {
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

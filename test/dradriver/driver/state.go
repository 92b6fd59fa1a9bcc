package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/types"
)

// stateFileName is the checkpoint's name inside the plugin data directory.
const stateFileName = "state.json"

// PreparedClaim is what the driver remembers about one prepared claim: enough to unprepare it
// after a restart, when the claim object may already be gone.
type PreparedClaim struct {
	// Namespace and Name identify the claim in logs.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Devices are the claim's devices of this driver, each with the interfaces made for it.
	Devices []PreparedDevice `json:"devices"`
}

// PreparedDevice is one allocated device of a prepared claim.
type PreparedDevice struct {
	Device
	// Request is the claim's request the device was allocated for.
	Request string `json:"request"`
	// Pool is the pool of the allocation result.
	Pool string `json:"pool"`
	// CDIDeviceID is the CDI device returned to the kubelet, empty without a CDI directory.
	CDIDeviceID string `json:"cdiDeviceID,omitempty"`
}

// checkpoint is the on-disk form of the prepared claims.
type checkpoint struct {
	Claims map[types.UID]PreparedClaim `json:"claims"`
}

// loadState reads the checkpoint in dir; a missing file is an empty state.
func loadState(dir string) (map[types.UID]PreparedClaim, error) {
	data, err := os.ReadFile(filepath.Join(dir, stateFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]PreparedClaim{}, nil
	}
	if err != nil {
		return nil, err
	}
	var cp checkpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(dir, stateFileName), err)
	}
	if cp.Claims == nil {
		cp.Claims = map[types.UID]PreparedClaim{}
	}
	return cp.Claims, nil
}

// saveState replaces the checkpoint in dir. It writes a temporary file and renames it, so that a
// crash leaves either the old or the new state, never half of one.
func saveState(dir string, claims map[types.UID]PreparedClaim) error {
	data, err := json.MarshalIndent(checkpoint{Claims: claims}, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, stateFileName), data)
}

// writeFileAtomic writes data to a temporary file beside name, syncs it and renames it to name.
func writeFileAtomic(name string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), name)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

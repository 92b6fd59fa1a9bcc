package driver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// cdiClass is the class part of the driver's CDI kind: "<driver name>/nic".
const cdiClass = "nic"

// cdiVersion is the oldest CDI spec version with everything the spec uses (environment edits),
// so that any CDI-enabled runtime reads it.
const cdiVersion = "0.5.0"

// cdiSpec is the subset of the CDI spec format the driver writes.
type cdiSpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []cdiDevice `json:"devices"`
}

type cdiDevice struct {
	Name           string       `json:"name"`
	ContainerEdits cdiEditsSpec `json:"containerEdits"`
}

type cdiEditsSpec struct {
	Env []string `json:"env"`
}

// cdiDeviceID is the CDI device ID of one device of a claim. The claim UID is part of the
// name because runtimes cache CDI specs: a reused name could resolve to a stale spec.
func cdiDeviceID(driverName string, claim types.UID, device string) string {
	return fmt.Sprintf("%s/%s=%s-%s", driverName, cdiClass, claim, device)
}

// cdiSpecPath is the spec file of one claim.
func cdiSpecPath(dir, driverName string, claim types.UID) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%s.json", driverName, claim))
}

// writeCDISpec writes the claim's spec: one CDI device per allocated device, whose only edit is
// an environment variable PODGATE_NET_<DEVICE>=<interface> (CDI rejects devices without edits).
func writeCDISpec(dir, driverName string, claim types.UID, devices []PreparedDevice) error {
	spec := cdiSpec{Version: cdiVersion, Kind: driverName + "/" + cdiClass}
	for _, dev := range devices {
		spec.Devices = append(spec.Devices, cdiDevice{
			Name: string(claim) + "-" + dev.Name,
			ContainerEdits: cdiEditsSpec{Env: []string{
				"PODGATE_NET_" + strings.ToUpper(dev.Name) + "=" + dev.Interface,
			}},
		})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return writeFileAtomic(cdiSpecPath(dir, driverName, claim), data)
}

// removeCDISpec deletes the claim's spec; a missing file is success.
func removeCDISpec(dir, driverName string, claim types.UID) error {
	err := os.Remove(cdiSpecPath(dir, driverName, claim))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

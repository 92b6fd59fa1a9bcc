package rig

import (
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The neighbours: programs nobody here wrote that podgate's real-stack tests run beside it,
// built by install.sh's neighbours part at the versions of neighbours.env.
const (
	// Multus is multus-cni's thin plugin (cmd/multus), a CNI binary of type "multus".
	Multus = "multus"
	// DRAExampleDriver is dra-example-driver's kubelet plugin (cmd/dra-example-kubeletplugin).
	DRAExampleDriver = "dra-example-kubeletplugin"
	// DRANet is dranet, SIG Network's DRA driver for network interfaces (cmd/dranet).
	DRANet = "dranet"
)

//go:embed neighbours.env
var neighboursEnv string

// neighbourModules are each neighbour's Go module and its version's key in neighbours.env.
var neighbourModules = map[string]struct{ module, key string }{
	Multus:           {"gopkg.in/k8snetworkplumbingwg/multus-cni.v4", "MULTUS_VERSION"},
	DRAExampleDriver: {"sigs.k8s.io/dra-example-driver", "DRA_EXAMPLE_DRIVER_VERSION"},
	DRANet:           {"sigs.k8s.io/dranet", "DRANET_VERSION"},
}

// envLine is one KEY="value" line of neighbours.env.
var envLine = regexp.MustCompile(`(?m)^([A-Z_]+)="([^"]*)"$`)

// NeighbourVersion is the pinned version of a neighbour (Multus, DRAExampleDriver, DRANet).
func NeighbourVersion(name string) string {
	m, ok := neighbourModules[name]
	if !ok {
		panic(fmt.Sprintf("rig: unknown neighbour %q", name))
	}
	for _, l := range envLine.FindAllStringSubmatch(neighboursEnv, -1) {
		if l[1] == m.key {
			return l[2]
		}
	}
	panic(fmt.Sprintf("rig: neighbours.env has no %s", m.key))
}

// NeighbourModule is the Go module a neighbour is built from.
func NeighbourModule(name string) string { return neighbourModules[name].module }

// NeighbourBin is where install.sh puts a neighbour's binary.
func NeighbourBin(name string) string { return filepath.Join(InstallDir(), "neighbours", "bin", name) }

// CheckNeighbour reports, wrapping ErrNotInstalled, that a neighbour is not built, or not at its
// pinned version: the stamp install.sh writes beside the binary names the module@version it was
// built from.
func CheckNeighbour(name string) error {
	bin := NeighbourBin(name)
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%w (%s missing: run test/rig/install.sh neighbours)", ErrNotInstalled, bin)
	}
	want := NeighbourModule(name) + "@" + NeighbourVersion(name)
	stamp := filepath.Join(filepath.Dir(bin), "."+name)
	got, err := os.ReadFile(stamp)
	if err != nil || strings.TrimSpace(string(got)) != want {
		return fmt.Errorf("%w (%s is not %s, says %s: run test/rig/install.sh neighbours)", ErrNotInstalled, bin, want, stamp)
	}
	return nil
}

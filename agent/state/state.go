package state

import (
	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
	"github.com/podgate/podgate/sysctl"
)

// State is podgate's state on disk: the pod registry and the features' sections of its
// checkpoint.
type State struct {
	Sandboxes *registry.Registry
	// Claims are the DRA claims, Intents the DRA devices attached to sandboxes or being
	// attached, Sysctls each sandbox's sysctl results: each a section of the checkpoint.
	Claims  *manager.Claims
	Intents *attach.Intents
	Sysctls *sysctl.Records
}

// Read reads the checkpoint cp into the pod registry and the features' sections of it (the
// claims, the attach records, the sysctl records), each registered before anything changes the
// registry: a record the rebuild from the runtime drops leaves its attached devices as intents,
// an adopted sandbox gets the sysctls the runtime applied, and the PodResources service shows
// the pods' claims from the start. Every section podgate has is registered, so that a
// checkpoint is written back as it was read. opts are the registry's.
func Read(cp *registry.Checkpoint, opts ...registry.Option) (*State, error) {
	d, err := cp.ReadAll()
	if err != nil {
		return nil, err
	}
	reg := registry.NewRegistry(cp, d, opts...)
	claims, err := manager.NewClaims(reg)
	if err != nil {
		return nil, err
	}
	intents, err := attach.NewIntents(reg)
	if err != nil {
		return nil, err
	}
	sysctls, err := sysctl.NewRecords(reg)
	if err != nil {
		return nil, err
	}
	return &State{Sandboxes: reg, Claims: claims, Intents: intents, Sysctls: sysctls}, nil
}

package registry

import (
	"k8s.io/apimachinery/pkg/types"
)

// AttachedDevice is a DRA device's host interface that podgate moved into a pod: part of the
// sandbox's record, which gives it back when the sandbox stops. The intents to attach (before
// the record takes a device up) are package attach's section of the checkpoint.
type AttachedDevice struct {
	ClaimNamespace string    `json:"claimNamespace"`
	ClaimName      string    `json:"claimName"`
	ClaimUID       types.UID `json:"claimUID"`
	Driver         string    `json:"driver"`
	Pool           string    `json:"pool"`
	Device         string    `json:"device"`
	// Interface is what giving it back needs.
	Interface AttachedInterface `json:"interface"`
	// Published: its network data is in the claim's status.
	Published bool `json:"published,omitempty"`
}

// AttachedInterface is what podgate needs to give a host interface back after moving it into
// a pod. It mirrors the DRA feature's record of an attach (dra.Attached) field by field and tag
// by tag, so that the registry imports no feature and the checkpoint keeps its form.
type AttachedInterface struct {
	// HostName is the interface's name on the host, the name it gets back.
	HostName string `json:"hostName"`
	// PodName is the interface's name in the pod.
	PodName string `json:"podName"`
	// MTU is the interface's MTU on the host, restored when it comes back; 0: leave as is.
	MTU int `json:"mtu,omitempty"`
	// Up records that the interface was administratively up on the host.
	Up bool `json:"up,omitempty"`
	// Alias is the interface's alias on the host, restored when it comes back: while the
	// interface is away, its alias is podgate's mark.
	Alias string `json:"alias,omitempty"`
	// HardwareAddr is the interface's MAC address, as the pod sees it.
	HardwareAddr string `json:"hardwareAddr,omitempty"`
	// Addresses are the addresses podgate gave the interface in the pod, in CIDR notation.
	Addresses []string `json:"addresses,omitempty"`
}

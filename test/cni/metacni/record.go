package main

import (
	"time"

	"github.com/podgate/podgate/test/cni/record"
)

// Entry is one line of the record file: what one CNI call saw and did.
type Entry struct {
	// Time is when the call started.
	Time time.Time `json:"time"`
	// Command is the CNI command: ADD, DEL or CHECK.
	Command string `json:"command"`
	// ContainerID, Netns and IfName are CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME.
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	// Pod is the pod from CNI_ARGS.
	Pod podRef `json:"pod"`
	// Extension is podgate's extension Get answer (ADD only).
	Extension *extensionAnswer `json:"extension,omitempty"`
	// V1 is the kubelet-compatible v1 Get answer, per container (ADD only).
	V1 *v1Answer `json:"v1,omitempty"`
	// Delegated are the delegate calls made (ADD, DEL), or on DEL skipped.
	Delegated []delegation `json:"delegated,omitempty"`
	// Errors are what went wrong; a non-empty list means the call failed.
	Errors []string `json:"errors,omitempty"`
}

// extensionAnswer is what podgate.podresources.v1alpha1.PodResources/Get said of the pod.
type extensionAnswer struct {
	// Found is false when podgate answered NotFound.
	Found bool   `json:"found"`
	UID   string `json:"uid,omitempty"`
	// SandboxID is the pod's sandbox as podgate knows it; empty while its RunPodSandbox is in
	// flight, as it is during the CNI ADD of that sandbox.
	SandboxID string            `json:"sandboxID,omitempty"`
	Devices   []extensionDevice `json:"devices,omitempty"`
}

// extensionDevice is one prepared device of one of the pod's claims, with its network data.
type extensionDevice struct {
	ClaimNamespace string   `json:"claimNamespace"`
	ClaimName      string   `json:"claimName"`
	PodClaimName   string   `json:"podClaimName,omitempty"`
	Driver         string   `json:"driver"`
	Pool           string   `json:"pool"`
	Device         string   `json:"device"`
	HostInterface  string   `json:"hostInterface,omitempty"`
	InterfaceName  string   `json:"interfaceName,omitempty"`
	IPs            []string `json:"ips,omitempty"`
	MTU            int32    `json:"mtu,omitempty"`
	Attached       bool     `json:"attached,omitempty"`
}

// v1Answer is what the kubelet-compatible v1.PodResourcesLister/Get said of the pod.
type v1Answer struct {
	// Found is false when the v1 service answered NotFound.
	Found      bool          `json:"found"`
	Containers []v1Container `json:"containers,omitempty"`
}

// v1Container is one container of the v1 answer with the DRA claims listed under it.
type v1Container struct {
	Name             string            `json:"name"`
	DynamicResources []dynamicResource `json:"dynamicResources,omitempty"`
}

// dynamicResource is one DRA claim of a container in the v1 answer.
type dynamicResource struct {
	ClaimNamespace string        `json:"claimNamespace"`
	ClaimName      string        `json:"claimName"`
	Devices        []claimDevice `json:"devices,omitempty"`
}

// claimDevice is one device of a claim in the v1 answer.
type claimDevice struct {
	Driver string `json:"driver"`
	Pool   string `json:"pool"`
	Device string `json:"device"`
}

// appendEntry adds e as one line to the record file at path, under a lock: containerd runs CNI
// for several pods at once.
func appendEntry(path string, e Entry) error { return record.AppendJSON(path, e) }

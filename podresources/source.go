package podresources

import (
	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// PodLister returns every pod podgate knows, and the revision of the state they were read
// at: a Watch sends the pods, then the events of later revisions. The pods are the caller's
// (the lister builds them afresh).
type PodLister interface {
	Pods() (pods []*pb.Pod, revision uint64)
}

// PodGetter returns one pod podgate knows, by namespace and name.
type PodGetter interface {
	Pod(namespace, name string) (*pb.Pod, bool)
}

// Container is one of a pod's containers as its spec names it, for the v1 answer.
type Container struct {
	Name string
	// Claims are the pod's claim names (spec.resourceClaims[].name) that the container names
	// in resources.claims.
	Claims []string
}

// ContainerLister returns a pod's containers from its spec: the restartable init containers
// (sidecars) then the containers, as the kubelet lists them. ok is false when the spec is not
// known; then every claim of the pod is listed once, under the first container the kubelet
// reports.
type ContainerLister interface {
	Containers(pod *pb.Pod) (containers []Container, ok bool)
}

// Source is everything the services read from podgate.
type Source interface {
	PodLister
	PodGetter
	ContainerLister
}

// PullLister returns the image pulls in podgate's pull governor, oldest first: every pod's
// when namespace and name are empty, else that pod's. The messages are the caller's.
type PullLister interface {
	Pulls(namespace, name string) []*pb.ImagePull
}

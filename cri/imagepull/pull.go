package imagepull

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// Priority orders waiting pulls: a higher one starts first.
type Priority int

// The priorities, lowest first. They follow Kubernetes' built-in priority classes.
const (
	// PriorityNormal is every pod that is not critical, and pulls without a pod.
	PriorityNormal Priority = iota
	// PriorityClusterCritical is the system-cluster-critical class.
	PriorityClusterCritical
	// PriorityNodeCritical is the system-node-critical class.
	PriorityNodeCritical

	numPriorities = int(PriorityNodeCritical) + 1
)

// Kubernetes' built-in priority classes and their values.
const (
	NodeCriticalClass    = "system-node-critical"
	ClusterCriticalClass = "system-cluster-critical"
	nodeCriticalValue    = 2000001000
	clusterCriticalValue = 2000000000
)

// String is the name used in logs.
func (p Priority) String() string {
	switch p {
	case PriorityNodeCritical:
		return NodeCriticalClass
	case PriorityClusterCritical:
		return ClusterCriticalClass
	default:
		return "normal"
	}
}

// PriorityOf maps a pod's priority class name, or failing that its numeric priority (nil when
// unknown), to a Priority.
func PriorityOf(className string, value *int32) Priority {
	switch className {
	case NodeCriticalClass:
		return PriorityNodeCritical
	case ClusterCriticalClass:
		return PriorityClusterCritical
	}
	switch {
	case value == nil:
		return PriorityNormal
	case *value >= nodeCriticalValue:
		return PriorityNodeCritical
	case *value >= clusterCriticalValue:
		return PriorityClusterCritical
	}
	return PriorityNormal
}

// Pull is one caller's image pull, as the governor sees it.
type Pull struct {
	// Image is the normalised image reference (e.g. index.docker.io/library/busybox:1.35).
	Image string
	// Registry is the registry host, with Docker Hub's aliases normalised to docker.io.
	Registry string
	// PodUID is the UID of the pod the image is for; empty when the call names no pod.
	PodUID string
	// Pod names that pod, for logs.
	Pod klog.ObjectRef
	// Priority orders the pull in the queue.
	Priority Priority

	// key identifies the pulls that may share a backend call.
	key flightKey
}

// flightKey is what concurrent pulls must have in common to share one backend call. auth is a
// hash: the credentials themselves are never kept.
type flightKey struct {
	image, handler string
	auth           [sha256.Size]byte
}

// NewPull checks a PullImage request and describes it. An empty or malformed image reference
// is InvalidArgument. The priority is left normal: the caller sets it.
func NewPull(req *runtimeapi.PullImageRequest) (Pull, error) {
	image := req.GetImage().GetImage()
	if image == "" {
		return Pull{}, status.Error(codes.InvalidArgument, "image reference is empty")
	}
	ref, err := name.ParseReference(image)
	if err != nil {
		return Pull{}, status.Errorf(codes.InvalidArgument, "image reference %q: %v", image, err)
	}
	md := req.GetSandboxConfig().GetMetadata()
	p := Pull{
		Image:    ref.Name(),
		Registry: normaliseRegistry(ref.Context().RegistryStr()),
		PodUID:   md.GetUid(),
		Pod:      klog.KRef(md.GetNamespace(), md.GetName()),
	}
	auth, err := hashAuth(req.GetAuth())
	if err != nil {
		return Pull{}, status.Errorf(codes.InvalidArgument, "auth: %v", err)
	}
	p.key = flightKey{image: p.Image, handler: req.GetImage().GetRuntimeHandler(), auth: auth}
	return p, nil
}

// hashAuth hashes the credentials (deterministic encoding, so equal credentials hash equal).
// No credentials hash as all zeroes.
func hashAuth(a *runtimeapi.AuthConfig) ([sha256.Size]byte, error) {
	if a == nil || proto.Size(a) == 0 {
		return [sha256.Size]byte{}, nil
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(a)
	if err != nil {
		return [sha256.Size]byte{}, err
	}
	return sha256.Sum256(b), nil
}

// RegistryHost validates and normalises a registry host as written in configuration
// (imagePulls.perRegistry keys): Docker Hub's aliases become docker.io, hosts are lower case.
func RegistryHost(host string) (string, error) {
	if host == "" {
		return "", fmt.Errorf("empty registry host")
	}
	r, err := name.NewRegistry(host)
	if err != nil {
		return "", err
	}
	return normaliseRegistry(r.RegistryStr()), nil
}

func normaliseRegistry(host string) string {
	host = strings.ToLower(host)
	switch host {
	case name.DefaultRegistry, "registry-1.docker.io", "docker.io":
		return "docker.io"
	}
	return host
}

package imagepull

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
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
	// Image is the image reference as containerd's CRI normalises it: busybox is
	// docker.io/library/busybox:latest, and a reference with both a tag and a digest keeps only
	// the digest.
	Image string
	// Registry is the registry host of Image, lower case, with Docker Hub's aliases normalised
	// to docker.io.
	Registry string
	// PodUID is the UID of the pod the image is for; empty when the call names no pod.
	PodUID string
	// Pod names that pod, for logs.
	Pod klog.ObjectRef
	// Priority orders the pull in the queue.
	Priority Priority
	// Kind says what the pull fetches: an image (NewPull) or a security profile
	// (NewProfilePull).
	Kind Kind

	// key identifies the pulls that may share a backend call.
	key flightKey
}

// flightKey is what concurrent pulls must have in common to share one backend call. auth is a
// hash: the credentials themselves are never kept. A security profile's pull also has its
// profile kind and a hash of the request's fields podgate does not know (none: zero).
type flightKey struct {
	image, handler string
	auth           [sha256.Size]byte
	kind           Kind
	profile        ProfileKind
	unknown        [sha256.Size]byte
}

// NewPull checks a PullImage request and describes it. The image reference is read as
// containerd's CRI reads it (reference.ParseDockerRef), so podgate refuses exactly the references
// containerd would; an empty or malformed one is errdefs.ErrInvalidArgument. The priority is left
// normal: the caller sets it.
func NewPull(req *runtimeapi.PullImageRequest) (Pull, error) {
	image := req.GetImage().GetImage()
	if image == "" {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "image reference is empty")
	}
	ref, err := reference.ParseDockerRef(image)
	if err != nil {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "image reference %q: %v", image, err)
	}
	md := req.GetSandboxConfig().GetMetadata()
	p := Pull{
		Image:    ref.String(),
		Registry: normaliseRegistry(reference.Domain(ref)),
		PodUID:   md.GetUid(),
		Pod:      klog.KRef(md.GetNamespace(), md.GetName()),
	}
	auth, err := hashAuth(req.GetAuth())
	if err != nil {
		return Pull{}, errorf(errdefs.ErrInvalidArgument, "auth: %v", err)
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

// ValidatePerRegistry checks a per-registry cap map (the configuration's
// imagePulls.perRegistry, named field in the errors): each key a registry host, no two keys
// the same registry once normalised, each cap positive. Every bad key is reported.
func ValidatePerRegistry(field string, perRegistry map[string]int32) error {
	errs := []error{ValidateRegistryHosts(field, maps.Keys(perRegistry))}
	for _, host := range slices.Sorted(maps.Keys(perRegistry)) {
		if v := perRegistry[host]; v <= 0 {
			errs = append(errs, fmt.Errorf("%s[%q]: must be positive, got %d", field, host, v))
		}
	}
	return errors.Join(errs...)
}

// ValidateRegistryHosts checks the keys of a per-registry map of the configuration (field,
// such as imagePulls.perRegistryRate, named in the errors): each a registry host, no two the
// same registry once normalised. Every bad key is reported.
func ValidateRegistryHosts(field string, hosts iter.Seq[string]) error {
	var errs []error
	seen := map[string]string{}
	for _, host := range slices.Sorted(hosts) {
		key := fmt.Sprintf("%s[%q]", field, host)
		norm, err := RegistryHost(host)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", key, err))
			continue
		}
		if other, dup := seen[norm]; dup {
			errs = append(errs, fmt.Errorf("%s: the same registry as %q (%s)", key, other, norm))
		}
		seen[norm] = host
	}
	return errors.Join(errs...)
}

// RegistryHost validates and normalises a registry host as written in configuration
// (imagePulls.perRegistry keys) into the form of [Pull.Registry]: Docker Hub's aliases become
// docker.io, hosts are lower case. A host is valid when image references starting with it name
// it as their registry: "myregistry" is not, since "myregistry/app" is an image on Docker Hub.
func RegistryHost(host string) (string, error) {
	if host == "" {
		return "", errors.New("empty registry host")
	}
	ref, err := reference.ParseNormalizedNamed(host + "/image")
	if err != nil {
		return "", fmt.Errorf("not a registry host: %w", err)
	}
	norm := normaliseRegistry(host)
	if d := normaliseRegistry(reference.Domain(ref)); d != norm {
		return "", fmt.Errorf("not a registry host: an image %s/name is on %s", host, d)
	}
	return norm, nil
}

// normaliseRegistry makes the spellings of one registry equal. In image references
// distribution's reference already turns index.docker.io into docker.io, but a configuration
// key is a bare host, and registry-1.docker.io (Docker Hub's API endpoint) is Docker Hub too.
// Hosts are case-insensitive, and a reference may spell one in capitals ("UPPER/app" is on
// the registry "UPPER").
func normaliseRegistry(host string) string {
	host = strings.ToLower(host)
	switch host {
	case "index.docker.io", "registry-1.docker.io":
		return "docker.io"
	}
	return host
}

package config

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podgate/podgate/cri/endpoint"
)

// Defaults of the imagePulls section.
const (
	// DefaultPriorityLabel is the pod label (or annotation) read for a pull's priority class when
	// podgate has no Kubernetes API access, or does not know the pod yet.
	DefaultPriorityLabel = "podgate.dev/priority-class"
	// DefaultPriorityNamespace is the namespace whose pods may claim a critical priority with
	// that label: Kubernetes admits the system-* classes only there by default.
	DefaultPriorityNamespace = "kube-system"
)

// ImagePulls configures the image pull governor (the imagePulls section).
type ImagePulls struct {
	// MaxParallel caps the PullImage calls in flight to the runtime on this node, like the
	// kubelet's maxParallelImagePulls: unset means unlimited, 1 means serial.
	MaxParallel *int32 `json:"maxParallel,omitempty"`
	// PerRegistry caps the pulls in flight per registry host (as in the image reference;
	// docker.io, index.docker.io and registry-1.docker.io are one host), on top of MaxParallel.
	PerRegistry map[string]int32 `json:"perRegistry,omitempty"`
	// PriorityLabel is the pod label or annotation whose value (system-node-critical or
	// system-cluster-critical) gives a pull its priority when the pod is not known from the
	// API server. Default podgate.dev/priority-class.
	PriorityLabel string `json:"priorityLabel,omitempty"`
	// PriorityNamespaces are the namespaces whose pods may claim a critical priority through
	// PriorityLabel. Default [kube-system]; [] turns the fallback off.
	PriorityNamespaces []string `json:"priorityNamespaces,omitempty"`
	// ContainerdAddress is containerd's own socket (its content service shows the bytes of a
	// pull in progress: podgate's pull progress). Unset means the image endpoint
	// (imageEndpoint, else runtimeEndpoint), which is containerd's socket when the runtime is
	// containerd; "" turns pull progress off.
	ContainerdAddress *string `json:"containerdAddress,omitempty"`
	// ContainerdNamespace is the containerd namespace of the CRI's images. Default k8s.io.
	ContainerdNamespace string `json:"containerdNamespace,omitempty"`
	// WaitEventAfter is how long a pull waits for a slot before its pod gets an Event saying
	// why (which cap, its place in the queue). Default 5s.
	WaitEventAfter Duration `json:"waitEventAfter,omitzero"`
	// ProgressEventAfter is how long a pull runs before its pod gets an Event with its
	// progress (bytes done of total, rate); then again every ProgressEventInterval. Default 30s.
	ProgressEventAfter Duration `json:"progressEventAfter,omitzero"`
	// ProgressEventInterval is the least time between two progress Events of one pull.
	// Default 30s.
	ProgressEventInterval Duration `json:"progressEventInterval,omitzero"`
}

// Defaults of the pull Events.
const (
	DefaultPullWaitEventAfter        = 5 * time.Second
	DefaultPullProgressEventAfter    = 30 * time.Second
	DefaultPullProgressEventInterval = 30 * time.Second
	DefaultContainerdNamespace       = "k8s.io"
)

func (p *ImagePulls) setDefaults() {
	if p.PriorityLabel == "" {
		p.PriorityLabel = DefaultPriorityLabel
	}
	if p.PriorityNamespaces == nil {
		p.PriorityNamespaces = []string{DefaultPriorityNamespace}
	}
	if p.ContainerdNamespace == "" {
		p.ContainerdNamespace = DefaultContainerdNamespace
	}
	if p.WaitEventAfter.Duration == 0 {
		p.WaitEventAfter.Duration = DefaultPullWaitEventAfter
	}
	if p.ProgressEventAfter.Duration == 0 {
		p.ProgressEventAfter.Duration = DefaultPullProgressEventAfter
	}
	if p.ProgressEventInterval.Duration == 0 {
		p.ProgressEventInterval.Duration = DefaultPullProgressEventInterval
	}
}

// validate reports every bad field of the section, named from the file's root.
func (p *ImagePulls) validate() error {
	var errs []error
	if p.MaxParallel != nil && *p.MaxParallel <= 0 {
		errs = append(errs, fmt.Errorf("imagePulls.maxParallel: must be positive, got %d (leave it unset for unlimited)", *p.MaxParallel))
	}
	// perRegistry's keys are registry hosts by the image-pull feature's rules: agent.Validate
	// checks them.
	if p.PriorityLabel != "" {
		for _, msg := range validation.IsQualifiedName(p.PriorityLabel) {
			errs = append(errs, fmt.Errorf("imagePulls.priorityLabel: %q: %s", p.PriorityLabel, msg))
		}
	}
	if p.ContainerdAddress != nil && *p.ContainerdAddress != "" {
		if _, err := endpoint.Parse(*p.ContainerdAddress); err != nil {
			errs = append(errs, fmt.Errorf("imagePulls.containerdAddress: %w", err))
		}
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"waitEventAfter", p.WaitEventAfter.Duration}, {"progressEventAfter", p.ProgressEventAfter.Duration}, {"progressEventInterval", p.ProgressEventInterval.Duration}} {
		if d.value < time.Second {
			errs = append(errs, fmt.Errorf("imagePulls.%s: %s: must be at least 1s", d.name, d.value))
		}
	}
	for i, ns := range p.PriorityNamespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, fmt.Errorf("imagePulls.priorityNamespaces[%d]: %q: %s", i, ns, msg))
		}
	}
	return errors.Join(errs...)
}

// validateKube checks the Kubernetes API settings (kubeconfig, nodeName).
func (c *Configuration) validateKube() error {
	if c.NodeName == "" {
		return nil
	}
	var errs []error
	for _, msg := range validation.IsDNS1123Subdomain(c.NodeName) {
		errs = append(errs, fmt.Errorf("nodeName: %q: %s", c.NodeName, msg))
	}
	return errors.Join(errs...)
}

// ContainerdSocket is the path of containerd's socket for pull progress; "" when it is off.
// The section is valid, and so is imageEndpoint.
func (c *Configuration) ContainerdSocket() string {
	addr := c.ImageBackend()
	if c.ImagePulls.ContainerdAddress != nil {
		addr = *c.ImagePulls.ContainerdAddress
	}
	if addr == "" {
		return ""
	}
	p, _ := endpoint.Parse(addr) // validated
	return p
}

package config

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podgate/podgate/cri/imagepull"
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
}

func (p *ImagePulls) setDefaults() {
	if p.PriorityLabel == "" {
		p.PriorityLabel = DefaultPriorityLabel
	}
	if p.PriorityNamespaces == nil {
		p.PriorityNamespaces = []string{DefaultPriorityNamespace}
	}
}

// validate reports every bad field of the section, named from the file's root.
func (p *ImagePulls) validate() error {
	var errs []error
	if p.MaxParallel != nil && *p.MaxParallel <= 0 {
		errs = append(errs, fmt.Errorf("imagePulls.maxParallel: must be positive, got %d (leave it unset for unlimited)", *p.MaxParallel))
	}
	seen := map[string]string{}
	for _, host := range slices.Sorted(maps.Keys(p.PerRegistry)) {
		field := fmt.Sprintf("imagePulls.perRegistry[%q]", host)
		norm, err := imagepull.RegistryHost(host)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
			continue
		}
		if other, dup := seen[norm]; dup {
			errs = append(errs, fmt.Errorf("%s: the same registry as %q (%s)", field, other, norm))
		}
		seen[norm] = host
		if v := p.PerRegistry[host]; v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive, got %d", field, v))
		}
	}
	if p.PriorityLabel != "" {
		for _, msg := range validation.IsQualifiedName(p.PriorityLabel) {
			errs = append(errs, fmt.Errorf("imagePulls.priorityLabel: %q: %s", p.PriorityLabel, msg))
		}
	}
	for i, ns := range p.PriorityNamespaces {
		for _, msg := range validation.IsDNS1123Label(ns) {
			errs = append(errs, fmt.Errorf("imagePulls.priorityNamespaces[%d]: %q: %s", i, ns, msg))
		}
	}
	return errors.Join(errs...)
}

// Limits returns the governor's caps, registry hosts normalised. The section is valid.
func (p *ImagePulls) Limits() imagepull.Limits {
	var l imagepull.Limits
	if p.MaxParallel != nil {
		l.MaxParallel = int(*p.MaxParallel)
	}
	if len(p.PerRegistry) > 0 {
		l.PerRegistry = map[string]int{}
		for host, v := range p.PerRegistry {
			norm, _ := imagepull.RegistryHost(host) // validated
			l.PerRegistry[norm] = int(v)
		}
	}
	return l
}

// SandboxPriority is the priority fallback without the API.
func (p *ImagePulls) SandboxPriority() imagepull.SandboxPriority {
	return imagepull.SandboxPriority{Label: p.PriorityLabel, Namespaces: p.PriorityNamespaces}
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

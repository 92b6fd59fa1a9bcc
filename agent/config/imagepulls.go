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
	// PerRegistryRate is the request budget of registry hosts (keys as PerRegistry's): pulls
	// per interval, a token bucket, for a registry whose limit the operator knows.
	PerRegistryRate map[string]RegistryRate `json:"perRegistryRate,omitempty"`
	// CoolDown says how podgate treats a registry that pushes back, answering 429 Too Many
	// Requests or 503 with Retry-After (the imagePulls.coolDown section).
	CoolDown PullCoolDown `json:"coolDown,omitzero"`
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
	// Stall says when a running pull is stalled and podgate cancels it (the imagePulls.stall
	// section): its rate, read from containerd's content store, stays below
	// MinBytesPerSecond over Window.
	Stall PullStall `json:"stall,omitzero"`
}

// PullStall is the imagePulls.stall section.
type PullStall struct {
	// MinBytesPerSecond is the least rate a running pull must keep over Window. Default 8192
	// (DefaultPullStallMinBytesPerSecond); 0 turns stall detection off.
	MinBytesPerSecond *int64 `json:"minBytesPerSecond,omitempty"`
	// Window is how long a pull's rate must stay below MinBytesPerSecond for podgate to
	// cancel it, counted from the first reading of its bytes after the runtime started it.
	// Default 10m (DefaultPullStallWindow); at least 2s, two readings of the content store.
	Window Duration `json:"window,omitzero"`
}

// Defaults of imagePulls.stall: a pull that shows less than 4.7 MiB in ten minutes (8 KiB/s,
// 64 kbit/s: a 50 MiB image would take 1 h 45 min). An honest registry, however slow, sends far
// more than 64 kbit/s. Ten minutes outlast a registry's pauses (a TCP retransmission backs off to
// two minutes; a registry's garbage collection or a proxy's cache fill takes seconds to minutes),
// and twice containerd's image_pull_progress_timeout, which catches a pull that receives nothing
// at all. The product is well above containerd's granularity: it writes a blob to its content
// store in 1 MiB pieces, up to three blobs at once, and podgate counts those 3 MiB as possibly
// received, so a stall is found when a pull shows less than about 1.7 MiB in the window.
const (
	DefaultPullStallMinBytesPerSecond = 8 << 10
	DefaultPullStallWindow            = 10 * time.Minute
	// minPullStallWindow: the content store is read once a second; a window needs two readings.
	minPullStallWindow = 2 * time.Second
)

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
	if p.Stall.MinBytesPerSecond == nil {
		m := int64(DefaultPullStallMinBytesPerSecond)
		p.Stall.MinBytesPerSecond = &m
	}
	if p.Stall.Window.Duration == 0 {
		p.Stall.Window.Duration = DefaultPullStallWindow
	}
	p.CoolDown.setDefaults()
	for host, r := range p.PerRegistryRate {
		if r.Burst == nil {
			b := int32(DefaultRegistryRateBurst)
			r.Burst = &b
			p.PerRegistryRate[host] = r
		}
	}
}

// Rule is the section with its defaults (setDefaults sets them too; Rule also serves a
// section built in code): the least rate, 0 when stall detection is off, and the window. The
// section is valid.
func (s PullStall) Rule() (minBytesPerSecond int64, window time.Duration) {
	minBytesPerSecond, window = DefaultPullStallMinBytesPerSecond, DefaultPullStallWindow
	if s.MinBytesPerSecond != nil {
		minBytesPerSecond = *s.MinBytesPerSecond
	}
	if s.Window.Duration != 0 {
		window = s.Window.Duration
	}
	return minBytesPerSecond, window
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
	return errors.Join(append(errs, p.Stall.validate(), p.CoolDown.validate(), validateRates(p.PerRegistryRate))...)
}

// validate checks the imagePulls.stall section.
func (s *PullStall) validate() error {
	var errs []error
	if s.MinBytesPerSecond != nil && *s.MinBytesPerSecond < 0 {
		errs = append(errs, fmt.Errorf("imagePulls.stall.minBytesPerSecond: must not be negative, got %d (0 turns stall detection off)", *s.MinBytesPerSecond))
	}
	if w := s.Window.Duration; w != 0 && w < minPullStallWindow {
		errs = append(errs, fmt.Errorf("imagePulls.stall.window: %s: must be at least %s (the content store is read once a second)", w, minPullStallWindow))
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

package kubeletinfo

import (
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/util/version"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
)

// The kubelet feature gates podgate's features overlap.
const (
	// MemoryQoS makes the kubelet write memory.min/memory.low and memory.high on cgroup v2:
	// alpha and off by default before 1.37, beta and on from 1.37.
	MemoryQoS = "MemoryQoS"
	// DefaultPodSysctls lets the kubelet add its configuration's defaultPodSysctls to every
	// pod's sandbox: new in 1.37, alpha and off by default.
	DefaultPodSysctls = "DefaultPodSysctls"
)

// gateDefaults is each gate's default by kubelet release, as the kubelet's
// pkg/features/kube_features.go has it: on from the release given, off before (0: off in
// every release).
var gateDefaults = map[string]*version.Version{
	MemoryQoS:         version.MajorMinor(1, 37),
	DefaultPodSysctls: nil,
}

// Kubelet is what podgate knows of its node's kubelet. The zero value knows nothing: every
// gate at an unknown default, no configuration read.
type Kubelet struct {
	// Version is the kubelet's version as the Node reports it (status.nodeInfo.kubeletVersion,
	// "v1.37.2"); empty while the Node has not been read, or without the Kubernetes API.
	Version string
	// ConfigPath is the kubelet's configuration file podgate read (resources.kubeletConfig);
	// empty: none given.
	ConfigPath string
	// Config is that file, decoded without the kubelet's defaulting; nil when no file was given
	// or it could not be read.
	Config *kubeletconfig.KubeletConfiguration
	// CgroupV2 is whether the node runs cgroup v2 alone (unified mode), where the kubelet's
	// memory QoS applies.
	CgroupV2 bool
}

// Gate is one kubelet feature gate as podgate sees it.
type Gate struct {
	// On is the gate's value; meaningful only when Known.
	On bool
	// Known is false when neither the configuration file sets the gate nor the kubelet's
	// version is known: then its default cannot be told.
	Known bool
	// Why says where the value comes from, for a log line.
	Why string
}

// Gate is the kubelet's feature gate name: the configuration file's featureGates when it sets
// it, else the gate's default for the kubelet's version. Gates set on the kubelet's command
// line (--feature-gates) are not seen.
func (k Kubelet) Gate(name string) Gate {
	if k.Config != nil {
		if on, set := k.Config.FeatureGates[name]; set {
			return Gate{On: on, Known: true, Why: fmt.Sprintf("featureGates.%s: %t in %s", name, on, k.ConfigPath)}
		}
	}
	from, tracked := gateDefaults[name]
	if tracked && from == nil {
		return Gate{Known: true, Why: name + " off by default"}
	}
	v, err := k.version()
	switch {
	case !tracked:
		return Gate{Why: name + ": a gate podgate does not track"}
	case err != nil:
		return Gate{Why: fmt.Sprintf("%s on by default from kubelet %d.%d, and the kubelet's version is not known (%v)", name, from.Major(), from.Minor(), err)}
	case v.AtLeast(from):
		return Gate{On: true, Known: true, Why: fmt.Sprintf("kubelet %s %s on by default", k.Version, name)}
	default:
		return Gate{Known: true, Why: fmt.Sprintf("kubelet %s %s off by default", k.Version, name)}
	}
}

// draPreparesFrom is the first kubelet release whose DRA manager prepares pods' claims by
// default: DynamicResourceAllocation is GA, on by default, in 1.34 (and locked on from 1.35).
var draPreparesFrom = version.MajorMinor(1, 34)

// PreparesDRAClaims is whether the kubelet's own DRA manager prepares pods' claims before it
// calls RunPodSandbox, by its version: from 1.34. known is false while the version is not known
// or not understood. An older kubelet may prepare too, with its feature gate on: the operator
// says so with dra.prepare never.
func (k Kubelet) PreparesDRAClaims() (prepares, known bool, why string) {
	v, err := k.version()
	switch {
	case err != nil:
		return false, false, fmt.Sprintf("the kubelet's version is not known (%v)", err)
	case v.AtLeast(draPreparesFrom):
		return true, true, fmt.Sprintf("kubelet %s prepares DRA claims (from %d.%d)", k.Version, draPreparesFrom.Major(), draPreparesFrom.Minor())
	default:
		return false, true, fmt.Sprintf("kubelet %s predates DRA on by default (%d.%d)", k.Version, draPreparesFrom.Major(), draPreparesFrom.Minor())
	}
}

// version is the kubelet's version, parsed.
func (k Kubelet) version() (*version.Version, error) {
	if k.Version == "" {
		return nil, fmt.Errorf("no Node read")
	}
	v, err := version.ParseGeneric(k.Version)
	if err != nil {
		return nil, fmt.Errorf("kubeletVersion %q: %w", k.Version, err)
	}
	return v, nil
}

// WritesMemoryQoS is whether the kubelet writes memory.min/memory.low and memory.high itself,
// as podgate's resources.memoryQoS does: its MemoryQoS gate on, on cgroup v2 (the kubelet's
// own two conditions). known is false when the gate's value cannot be told yet.
func (k Kubelet) WritesMemoryQoS() (writes, known bool, why string) {
	if !k.CgroupV2 {
		return false, true, "not cgroup v2, which the kubelet's memory QoS needs"
	}
	g := k.Gate(MemoryQoS)
	if !g.Known {
		return false, false, g.Why
	}
	return g.On, true, g.Why + ", cgroup v2"
}

// DefaultPodSysctls are the sysctls the kubelet adds to every pod that does not set them
// (its defaultPodSysctls), when it does: its DefaultPodSysctls gate on. Nil otherwise; why
// says which.
func (k Kubelet) DefaultPodSysctls() (sysctls map[string]string, why string) {
	if k.Config == nil || len(k.Config.DefaultPodSysctls) == 0 {
		return nil, "no defaultPodSysctls in the kubelet's configuration" + k.seen()
	}
	g := k.Gate(DefaultPodSysctls)
	if !g.On {
		return nil, fmt.Sprintf("defaultPodSysctls set, but %s: the kubelet applies none", g.Why)
	}
	if v, err := k.version(); err == nil && !v.AtLeast(version.MajorMinor(1, 37)) {
		return nil, fmt.Sprintf("defaultPodSysctls set, but kubelet %s predates them (1.37)", k.Version)
	}
	return maps.Clone(k.Config.DefaultPodSysctls), g.Why
}

// PullCap is the kubelet's own cap on image pulls in flight: 1 with serializeImagePulls (its
// default), else maxParallelImagePulls; 0 when it has none. known is false without its
// configuration file, whose defaults cannot be assumed for a file podgate has not read.
func (k Kubelet) PullCap() (limit int, known bool, why string) {
	if k.Config == nil {
		return 0, false, "the kubelet's configuration not read" + k.seen()
	}
	c := k.Config
	serialize := c.SerializeImagePulls
	if serialize == nil {
		// The kubelet's defaulting (pkg/kubelet/apis/config/v1beta1/defaults.go): true unless
		// maxParallelImagePulls is 2 or more.
		on := c.MaxParallelImagePulls == nil || *c.MaxParallelImagePulls < 2
		serialize = &on
		if on {
			return 1, true, "serializeImagePulls unset: true by default, one pull at a time"
		}
	}
	switch {
	case *serialize:
		return 1, true, "serializeImagePulls: true, one pull at a time"
	case c.MaxParallelImagePulls != nil:
		return int(*c.MaxParallelImagePulls), true, fmt.Sprintf("maxParallelImagePulls: %d", *c.MaxParallelImagePulls)
	}
	return 0, true, "serializeImagePulls: false, maxParallelImagePulls unset: no cap"
}

// seen says which configuration file was, or was not, read.
func (k Kubelet) seen() string {
	if k.ConfigPath == "" {
		return " (resources.kubeletConfig unset)"
	}
	return " (" + k.ConfigPath + ")"
}

// Decision is, for one of podgate's features, who writes its values on this node and what
// podgate does, with the reason: one start-up log line, one line of check-config.
type Decision struct {
	// Feature names podgate's feature, as the log says it ("Memory QoS").
	Feature string
	// Writer is who sets the values: "kubelet", "podgate" or "none".
	Writer string
	// Podgate is what podgate does: "writes", "verifies", "leaves", "caps", "off"…
	Podgate string
	// Reason says why, from the kubelet's version and configuration.
	Reason string
}

// KeysAndValues are the decision as a log line's key/value pairs, the feature as the message:
// logger.Info(d.Feature, d.KeysAndValues()...).
func (d Decision) KeysAndValues() []any {
	return []any{"writer", d.Writer, "podgate", d.Podgate, "reason", d.Reason}
}

// String is the decision as check-config prints it.
func (d Decision) String() string {
	return fmt.Sprintf("%s: writer=%s podgate=%s reason=%q", d.Feature, d.Writer, d.Podgate, strings.TrimSpace(d.Reason))
}

package kubeletinfo

import (
	"fmt"
	"strings"
)

// The features whose work the kubelet may do, as their decisions name them.
const (
	FeatureMemoryQoS  = "Memory QoS"
	FeatureSysctls    = "Default sysctls"
	FeatureImagePulls = "Image pull caps"
)

// Who writes a feature's values.
const (
	WriterKubelet = "kubelet"
	WriterPodgate = "podgate"
	WriterNone    = "none"
	// WriterUnknown is a writer that cannot be told yet: the kubelet's version decides.
	WriterUnknown = "unknown"
)

// MemoryQoSDecision says who writes memory.min/memory.low and memory.high on this node:
// the kubelet where it does (podgate then verifies them only), else podgate when its own
// memory QoS is on (podgateOn: resources.memoryQoS, with the Kubernetes API), nobody off
// cgroup v2. Before the kubelet's version is known podgate writes, leaving alone
// each request the kubelet already gave memory QoS.
func (k Kubelet) MemoryQoSDecision(podgateOn bool) Decision {
	d := Decision{Feature: FeatureMemoryQoS}
	writes, known, why := k.WritesMemoryQoS()
	switch {
	case !k.CgroupV2:
		d.Writer, d.Podgate, d.Reason = WriterNone, "off", why+": neither the kubelet nor podgate writes memory QoS"
	case known && writes:
		d.Writer, d.Podgate, d.Reason = WriterKubelet, "verifies", why
		if podgateOn {
			d.Reason += "; podgate's memory QoS left to the kubelet"
		}
	case podgateOn && known:
		d.Writer, d.Podgate, d.Reason = WriterPodgate, "writes", why
	case podgateOn:
		d.Writer, d.Podgate, d.Reason = WriterPodgate, "writes", why+"; podgate writes until the kubelet's version is known, leaving a request the kubelet gave memory.min or memory.low as it is"
	case known:
		d.Writer, d.Podgate, d.Reason = WriterNone, "off", why+"; podgate's memory QoS off"
	default:
		d.Writer, d.Podgate, d.Reason = WriterUnknown, "verifies", why+"; podgate's memory QoS off"
	}
	return d
}

// SysctlsDecision says who adds default sysctls to pods: the kubelet (its defaultPodSysctls,
// which win on a key both set; conflicts is how many podgate's configuration sets otherwise),
// podgate (podgateDefaults: its podDefaults and namespaceDefaults, how many), or both, each
// key having one writer.
func (k Kubelet) SysctlsDecision(podgateDefaults, conflicts int) Decision {
	d := Decision{Feature: FeatureSysctls}
	kubelet, why := k.DefaultPodSysctls()
	switch {
	case len(kubelet) > 0 && podgateDefaults > 0:
		d.Writer, d.Podgate = WriterKubelet+"+"+WriterPodgate, "adds its own, verifies the kubelet's"
		d.Reason = fmt.Sprintf("%s: the kubelet's %d defaults win on their keys", why, len(kubelet))
		if conflicts > 0 {
			d.Reason += fmt.Sprintf("; %d of podgate's defaults differ and are left to the kubelet", conflicts)
		}
	case len(kubelet) > 0:
		d.Writer, d.Podgate, d.Reason = WriterKubelet, "verifies", fmt.Sprintf("%s: the kubelet's %d defaults", why, len(kubelet))
	case podgateDefaults > 0:
		d.Writer, d.Podgate, d.Reason = WriterPodgate, "writes", why
	default:
		d.Writer, d.Podgate, d.Reason = WriterNone, "off", why+"; no sysctls.podDefaults or namespaceDefaults"
	}
	return d
}

// PullsDecision says who holds back image pulls: the kubelet where its own cap is at or
// below one of podgate's (masked, from the pull feature's Limits.MaskedBy: podgate's queue
// never fills under it), else podgate's caps (podgateCapped), else nobody.
func (k Kubelet) PullsDecision(podgateCapped bool, masked []string) Decision {
	d := Decision{Feature: FeatureImagePulls}
	limit, known, why := k.PullCap()
	switch {
	case len(masked) > 0:
		d.Writer, d.Podgate = WriterKubelet, "never queues"
		d.Reason = fmt.Sprintf("%s: no more pulls at a time reach podgate than %d, so these caps never queue a pull: %s; set serializeImagePulls: false and maxParallelImagePulls unset or above podgate's caps",
			why, limit, strings.Join(masked, ", "))
	case podgateCapped && known && limit > 0:
		d.Writer, d.Podgate, d.Reason = WriterPodgate, "caps", why+", above podgate's caps"
	case podgateCapped:
		d.Writer, d.Podgate, d.Reason = WriterPodgate, "caps", why
	case known && limit > 0:
		d.Writer, d.Podgate, d.Reason = WriterKubelet, "shares", why+"; no imagePulls caps"
	default:
		d.Writer, d.Podgate, d.Reason = WriterNone, "shares", why+"; no imagePulls caps"
	}
	return d
}

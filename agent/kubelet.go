package agent

import (
	"context"
	"sync/atomic"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/cri/imagepull"
	"github.com/podgate/podgate/resources/cgroup"
	"github.com/podgate/podgate/sysctl"
)

// kubeletView is the node's kubelet as podgate knows it: its configuration file and cgroup
// mode from start-up, its version once the Node is read. The features ask it through the plain
// values and functions agent hands them (kubeletinfo is no feature's import).
type kubeletView struct {
	k atomic.Pointer[kubeletinfo.Kubelet]
}

// newKubeletView reads the kubelet's configuration file (resources.kubeletConfig; an
// unreadable one is logged and left out) on a node of these cgroups.
func newKubeletView(logger klog.Logger, path string, node cgroup.Node) *kubeletView {
	k, err := describeKubelet(path, node)
	if err != nil {
		logger.Error(err, "The kubelet's configuration could not be read: podgate decides without it", "path", path)
	}
	v := &kubeletView{}
	v.k.Store(&k)
	return v
}

// describeKubelet is the kubelet's description before its version is known, without its
// configuration when the file path names cannot be read.
func describeKubelet(path string, node cgroup.Node) (kubeletinfo.Kubelet, error) {
	k := kubeletinfo.Kubelet{ConfigPath: path, CgroupV2: node.Mode == cgroup.ModeUnified}
	if path == "" {
		return k, nil
	}
	var err error
	k.Config, err = cgroup.ReadKubeletConfig(path)
	return k, err
}

// get is the kubelet as known now.
func (v *kubeletView) get() kubeletinfo.Kubelet { return *v.k.Load() }

// writesMemoryQoS tells the resources feature whether the kubelet writes memory QoS itself,
// as far as is known: not before the kubelet's version decides its gate's default.
func (v *kubeletView) writesMemoryQoS() bool {
	writes, known, _ := v.get().WritesMemoryQoS()
	return known && writes
}

// learnVersion records the kubelet's version from its Node and logs memory QoS's decision
// again when the version changed it; podgateQoS is whether podgate's own memory QoS is on.
func (v *kubeletView) learnVersion(logger klog.Logger, version string, podgateQoS bool) {
	before := v.get()
	after := before
	after.Version = version
	v.k.Store(&after)
	if d := after.MemoryQoSDecision(podgateQoS); d != before.MemoryQoSDecision(podgateQoS) {
		logger.Info(d.Feature, d.KeysAndValues()...)
	}
}

// kubeletDecisions are, for each feature the kubelet may do part of, who does it on this node,
// with the default sysctls both set differently: what start-up logs and check-config prints.
// podgateQoS is whether podgate's own memory QoS is on.
func kubeletDecisions(k kubeletinfo.Kubelet, cfg *config.Configuration, podgateQoS bool) ([]kubeletinfo.Decision, []sysctl.Conflict) {
	kubeletDefaults, _ := k.DefaultPodSysctls()
	conflicts := sysctl.DefaultConflicts(sysctlConfig(&cfg.Sysctls, kubeletDefaults))
	podgateDefaults := len(cfg.Sysctls.PodDefaults)
	for _, d := range cfg.Sysctls.NamespaceDefaults {
		podgateDefaults += len(d)
	}
	limits := pullLimits(&cfg.ImagePulls)
	pullCap, _, _ := k.PullCap()
	return []kubeletinfo.Decision{
		k.MemoryQoSDecision(podgateQoS),
		k.SysctlsDecision(podgateDefaults, len(conflicts)),
		k.PullsDecision(limits.Capped(), limits.MaskedBy(pullCap)),
	}, conflicts
}

// logKubeletDecisions says at start-up, one line per feature, what podgate does on this node
// and why, and one line per default sysctl left to the kubelet; podgateQoS is whether
// podgate's own memory QoS is on.
func logKubeletDecisions(ctx context.Context, k kubeletinfo.Kubelet, cfg *config.Configuration, podgateQoS bool) {
	logger := klog.FromContext(ctx)
	decisions, conflicts := kubeletDecisions(k, cfg, podgateQoS)
	for _, d := range decisions {
		logger.Info(d.Feature, d.KeysAndValues()...)
	}
	for _, c := range conflicts {
		logger.Info("Default sysctl set by podgate and by the kubelet to different values: the kubelet's wins", c.KeysAndValues()...)
	}
}

// kubeletPullCap is the image-pull feature's option for the kubelet's own cap, when its
// configuration was read.
func kubeletPullCap(k kubeletinfo.Kubelet) []imagepull.FeatureOption {
	if n, known, _ := k.PullCap(); known {
		return []imagepull.FeatureOption{imagepull.WithKubeletCap(n)}
	}
	return nil
}

// KubeletDecisions (podgate check-config) are, for each feature the kubelet may do part of,
// what podgate would do on this node beside the kubelet whose configuration file is
// resources.kubeletConfig, one line each, and one line per default sysctl both set
// differently. The kubelet's version is not known here (the Node is not read): a gate whose
// default depends on it says so. podgate's memory QoS counts as on when asked for with a
// kubeconfig (start-up also needs the node's memory controller, which the Cgroups line says).
func KubeletDecisions(cfg *config.Configuration) []string {
	k, _ := describeKubelet(cfg.Resources.KubeletConfig, cgroup.Detect()) // Check reports the error
	decisions, conflicts := kubeletDecisions(k, cfg, cfg.Resources.MemoryQoS && cfg.Kubeconfig != "")
	var lines []string
	for _, d := range decisions {
		lines = append(lines, d.String())
	}
	for _, c := range conflicts {
		lines = append(lines, c.String())
	}
	return lines
}

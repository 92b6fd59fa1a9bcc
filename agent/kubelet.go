package agent

import (
	"context"

	"k8s.io/klog/v2"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kubeletinfo"
	"github.com/podgate/podgate/podresources/cgroup"
	"github.com/podgate/podgate/sysctl"
)

// newKubeletView reads the kubelet's configuration file (resources.kubeletConfig; an
// unreadable one is logged and left out) on a node of these cgroups.
func newKubeletView(logger klog.Logger, path string, node cgroup.Node) *kubeletinfo.View {
	k, err := describeKubelet(path, node)
	if err != nil {
		logger.Error(err, "The kubelet's configuration could not be read: podgate decides without it", "path", path)
	}
	return kubeletinfo.NewView(k)
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

//go:build linux

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
)

// gcTimeout bounds the wait for the kubelet to remove what the soak's deleted pods left: its
// container garbage collection removes stopped sandboxes and exited containers once a minute
// (ContainerGCPeriod, fixed in the kubelet), its housekeeping the pod directories and cgroups
// every two seconds.
const gcTimeout = 3 * time.Minute

// leftovers lists what the churn left behind.
func leftovers(ctx context.Context, pg *harness.Podgate, r *rig.Rig, work string) ([]string, error) {
	var left []string
	direct, err := rig.Dial(ctx, r.Endpoint)
	if err != nil {
		return nil, err
	}
	defer direct.Close(ctx)
	sbs, err := direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return nil, err
	}
	ctrs, err := direct.Runtime.ListContainers(ctx, nil)
	if err != nil {
		return nil, err
	}
	if len(sbs)+len(ctrs) > 0 {
		left = append(left, fmt.Sprintf("containerd holds %d sandboxes, %d containers", len(sbs), len(ctrs)))
	}
	netns, _ := filepath.Glob(filepath.Join(r.Dir, "state", "io.containerd.grpc.v1.cri", "netns", "*"))
	if len(netns) > 0 {
		left = append(left, fmt.Sprintf("%d network namespaces", len(netns)))
	}
	veths, _ := filepath.Glob(filepath.Join("/sys/class/net", r.Bridge, "brif", "*"))
	if len(veths) > 0 {
		left = append(left, fmt.Sprintf("%d interfaces on bridge %s", len(veths), r.Bridge))
	}
	// The registry forgets a sandbox on RemovePodSandbox; its checkpoint follows in the
	// background, within moments.
	var inRegistry float64
	var recs int
	err = poll(ctx, 10*time.Second, 100*time.Millisecond, func() (bool, error) {
		m, err := pg.Scrape(ctx)
		if err != nil {
			return false, err
		}
		rs, err := registry.NewCheckpoint(filepath.Join(work, "state")).Read()
		if err != nil {
			return false, err
		}
		inRegistry, recs = value(m, "podgate_registry_sandboxes"), len(rs)
		return inRegistry == 0 && recs == 0, nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		left = append(left, fmt.Sprintf("podgate's registry holds %.0f sandboxes, its checkpoint %d", inRegistry, recs))
	}
	return left, nil
}

// kubeletLeftovers lists what of the soak's pods the kubelet has not removed yet: sandboxes and
// containers in containerd (by their pods' namespace label), the kubelet's pod directories, the
// pods' log directories and their links in /var/log/containers, and the pods' cgroups.
func kubeletLeftovers(ctx context.Context, direct *rig.Client, c *cluster.Cluster) ([]string, error) {
	var left []string
	soak := map[string]string{"io.kubernetes.pod.namespace": namespace}
	sbs, err := direct.Runtime.ListPodSandbox(ctx, &runtimeapi.PodSandboxFilter{LabelSelector: soak})
	if err != nil {
		return nil, err
	}
	ready := 0
	for _, sb := range sbs {
		if sb.State == runtimeapi.PodSandboxState_SANDBOX_READY {
			ready++
		}
	}
	if ready > 0 {
		left = append(left, fmt.Sprintf("%d ready sandboxes of deleted pods in containerd", ready))
	}
	if stopped := len(sbs) - ready; stopped > 0 {
		left = append(left, fmt.Sprintf("%d stopped sandboxes in containerd that the kubelet's garbage collection has not removed", stopped))
	}
	ctrs, err := direct.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{LabelSelector: soak})
	if err != nil {
		return nil, err
	}
	if len(ctrs) > 0 {
		left = append(left, fmt.Sprintf("%d containers in containerd", len(ctrs)))
	}
	for _, g := range []struct{ what, pattern string }{
		{"pod directories of the kubelet", filepath.Join(c.KubeletRootDir(), "pods", "*")},
		// podLogsDir/<namespace>_<name>_<uid>, as the kubelet names them.
		{"pod log directories", filepath.Join(c.PodLogsDir(), namespace+"_*")},
		{"log links in /var/log/containers", "/var/log/containers/*_" + namespace + "_*"},
		{"pod cgroups (v1 hierarchies)", "/sys/fs/cgroup/*" + c.CgroupRoot() + "/kubepods/*/pod*"},
		{"pod cgroups (v1 hierarchies)", "/sys/fs/cgroup/*" + c.CgroupRoot() + "/kubepods/pod*"},
		{"pod cgroups (v2)", "/sys/fs/cgroup" + c.CgroupRoot() + "/kubepods/*/pod*"},
		{"pod cgroups (v2)", "/sys/fs/cgroup" + c.CgroupRoot() + "/kubepods/pod*"},
	} {
		m, err := filepath.Glob(g.pattern)
		if err != nil {
			return nil, err
		}
		if len(m) > 0 {
			left = append(left, fmt.Sprintf("%d %s (%s)", len(m), g.what, g.pattern))
		}
	}
	return left, nil
}

// waitKubeletClean waits, up to gcTimeout, until the kubelet has removed everything of the
// soak's pods; it returns how long that took and what is left at the deadline.
func waitKubeletClean(ctx context.Context, r *rig.Rig, c *cluster.Cluster) (time.Duration, []string, error) {
	direct, err := rig.Dial(ctx, r.Endpoint)
	if err != nil {
		return 0, nil, err
	}
	defer direct.Close(ctx)
	start := time.Now()
	var left []string
	err = poll(ctx, gcTimeout, time.Second, func() (bool, error) {
		l, err := kubeletLeftovers(ctx, direct, c)
		if err != nil {
			return false, err
		}
		left = l
		return len(left) == 0, nil
	})
	if ctx.Err() != nil {
		return 0, nil, ctx.Err()
	}
	if err != nil && left == nil {
		return 0, nil, err
	}
	for i := range left {
		left[i] += fmt.Sprintf(" after %s of waiting", gcTimeout)
	}
	return time.Since(start), left, nil
}

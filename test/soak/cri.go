//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
)

// runCRI churns lifecycles with a CRI client making the kubelet's calls, one after the other.
func runCRI(ctx context.Context, cfg config, n node) (res result, err error) {
	r, work, bin := n.rig, n.work, n.bin
	pg, err := harness.Start(ctx, bin, harness.Options{Dir: work, RuntimeEndpoint: r.Endpoint})
	if err != nil {
		return res, err
	}
	defer func() {
		_, serr := pg.Stop(30 * time.Second)
		err = errors.Join(err, serr)
	}()
	c, err := rig.Dial(ctx, pg.Endpoint)
	if err != nil {
		return res, err
	}
	defer c.Close(ctx)
	rec := newRecorder(pg, cfg.n)
	for i := range cfg.n {
		if err := lifecycle(ctx, c, r, i); err != nil {
			return res, fmt.Errorf("lifecycle %d: %w", i, err)
		}
		if err := rec.finished(ctx); err != nil {
			return res, err
		}
	}
	res.took = time.Since(rec.start)
	res.samples = rec.samples
	if res.left, err = leftovers(ctx, pg, r, work); err != nil {
		return res, err
	}
	return res, nil
}

// lifecycle is one pod's life as the kubelet drives it, with its status and list calls.
func lifecycle(ctx context.Context, c *rig.Client, r *rig.Rig, i int) error {
	name := fmt.Sprintf("soak-%d", i)
	sb := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "soak", Uid: "uid-" + name},
		LogDirectory: filepath.Join(r.Dir, "pods", name),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	id, err := c.Runtime.RunPodSandbox(ctx, sb, "")
	if err != nil {
		return err
	}
	if _, err := c.Runtime.PodSandboxStatus(ctx, id, false); err != nil {
		return err
	}
	ctr, err := c.Runtime.CreateContainer(ctx, id, &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: "main"},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sh", "-c", "echo started; exec sleep 3600"},
		LogPath:  "main/0.log",
		Linux:    &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{CpuQuota: 50000, CpuPeriod: 100000, MemoryLimitInBytes: 64 << 20}},
	}, sb)
	if err != nil {
		return err
	}
	if err := c.Runtime.StartContainer(ctx, ctr); err != nil {
		return err
	}
	if _, _, err := c.Runtime.ExecSync(ctx, ctr, []string{"echo", "hi"}, 10*time.Second); err != nil {
		return err
	}
	if _, err := c.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{PodSandboxId: id}); err != nil {
		return err
	}
	if _, err := c.Runtime.ContainerStatus(ctx, ctr, false); err != nil {
		return err
	}
	if _, err := os.ReadFile(filepath.Join(sb.LogDirectory, "main", "0.log")); err != nil && !os.IsNotExist(err) {
		return err // logs: read as the kubelet's log reader would
	}
	if err := c.Runtime.StopContainer(ctx, ctr, 0); err != nil {
		return err
	}
	if err := c.Runtime.RemoveContainer(ctx, ctr); err != nil {
		return err
	}
	if err := c.Runtime.StopPodSandbox(ctx, id); err != nil {
		return err
	}
	if err := c.Runtime.RemovePodSandbox(ctx, id); err != nil {
		return err
	}
	_, err = c.Runtime.ListPodSandbox(ctx, nil)
	return err
}

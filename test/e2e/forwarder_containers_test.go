package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/rig"
)

// createWorkers is how many CreateContainer calls run at once: enough to keep containerd busy
// on 2 cores, few enough that its CPU is not shared with more waiting calls.
const createWorkers = 4

// containers are the sandboxes createContainers made, with their containers.
type containers struct {
	c      *rig.Client
	podIDs []string
	// created is how long creating them took.
	created time.Duration
}

// createContainers makes pods sandboxes on n's containerd, directly, each with perPod created
// (never started) busybox containers labelled and annotated as the kubelet's are, so that a
// ListContainers answer has a real node's size. They are removed with their sandboxes by
// remove, or when the benchmark ends.
func createContainers(b *testing.B, n *node, pods, perPod int) *containers {
	b.Helper()
	ctx := b.Context()
	start := time.Now()
	type job struct {
		podID string
		pod   *runtimeapi.PodSandboxConfig
		i     int
	}
	jobs := make(chan job)
	errs := make(chan error, createWorkers)
	var wg sync.WaitGroup
	for range createWorkers {
		wg.Go(func() {
			for j := range jobs {
				if _, err := n.direct.Runtime.CreateContainer(ctx, j.podID, kubeletContainer(j.pod, j.i), j.pod); err != nil {
					errs <- fmt.Errorf("CreateContainer %d in %s: %w", j.i, j.pod.Metadata.Name, err)
					return
				}
			}
		})
	}
	ctrs := &containers{c: n.direct}
	b.Cleanup(func() { ctrs.remove(b) })
	var failed error
feed:
	for p := range pods {
		name := "list-" + strconv.Itoa(p)
		pod := &runtimeapi.PodSandboxConfig{
			Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: "uid-" + name},
			LogDirectory: filepath.Join(n.rig.Dir, "pods", name),
			Linux:        &runtimeapi.LinuxPodSandboxConfig{},
		}
		id, err := n.direct.Runtime.RunPodSandbox(ctx, pod, "")
		if err != nil {
			failed = fmt.Errorf("RunPodSandbox %s: %w", name, err)
			break
		}
		ctrs.podIDs = append(ctrs.podIDs, id)
		for i := range perPod {
			select {
			case jobs <- job{id, pod, i}:
			case failed = <-errs:
				break feed
			}
		}
	}
	close(jobs)
	wg.Wait()
	if failed == nil && len(errs) > 0 {
		failed = <-errs
	}
	if failed != nil {
		b.Fatal(failed)
	}
	ctrs.created = time.Since(start)
	return ctrs
}

// kubeletContainer is container i of pod as the kubelet would create it: its labels and
// annotations are the kubelet's keys.
func kubeletContainer(pod *runtimeapi.PodSandboxConfig, i int) *runtimeapi.ContainerConfig {
	name := "c-" + strconv.Itoa(i)
	return &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: name},
		Image:    &runtimeapi.ImageSpec{Image: rig.BusyboxImage},
		Command:  []string{"/bin/sh", "-c", "exec sleep 3600"},
		LogPath:  name + "/0.log",
		Labels: map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       pod.Metadata.Name,
			"io.kubernetes.pod.namespace":  pod.Metadata.Namespace,
			"io.kubernetes.pod.uid":        pod.Metadata.Uid,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     "3f8e7a2b",
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
		},
		Linux: &runtimeapi.LinuxContainerConfig{},
	}
}

// remove stops and removes the sandboxes, and with them their containers, and returns how long
// that took. A second call does nothing.
func (ctrs *containers) remove(b *testing.B) time.Duration {
	if len(ctrs.podIDs) == 0 {
		return 0
	}
	ids, c := ctrs.podIDs, ctrs.c
	ctrs.podIDs = nil
	// Without the benchmark's cancellation: it has ended when cleanups run.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(b.Context()), 5*time.Minute)
	defer cancel()
	start := time.Now()
	for _, id := range ids {
		if err := c.Runtime.StopPodSandbox(ctx, id); err != nil {
			b.Errorf("StopPodSandbox %s: %v", id, err)
			continue
		}
		if err := c.Runtime.RemovePodSandbox(ctx, id); err != nil {
			b.Errorf("RemovePodSandbox %s: %v", id, err)
		}
	}
	left, err := c.Runtime.ListContainers(ctx, nil)
	if err != nil || len(left) != 0 {
		b.Errorf("after removing the sandboxes: %d containers left, %v", len(left), err)
	}
	return time.Since(start)
}

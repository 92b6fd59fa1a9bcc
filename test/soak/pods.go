//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/rig"
)

const (
	// namespace holds the soak's pods.
	namespace = "soak"
	// podTimeout bounds each wait of a lifecycle: Running after the create, gone after the
	// delete. A pod runs about a second after its creation on an idle node.
	podTimeout = 2 * time.Minute
	// graceSeconds is the pods' termination grace period and the deletes' grace period: short,
	// but not 0, which would remove the pod from the API before the kubelet stopped it.
	graceSeconds = 1
)

// soakPod is a busybox pod bound to the node (no scheduler runs) that logs a line and sleeps,
// and exits at once on SIGTERM.
func soakPod(name, node string) *corev1.Pod {
	no := false
	grace := int64(graceSeconds)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"app": "soak"}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			AutomountServiceAccountToken:  &no, // spares a TokenRequest and a mount per pod
			TerminationGracePeriodSeconds: &grace,
			Containers: []corev1.Container{{
				Name:            "main",
				Image:           rig.BusyboxImage,
				ImagePullPolicy: corev1.PullNever, // imported by the rig; no registry is reachable
				Command:         []string{"/bin/sh", "-c", "echo started; trap 'exit 0' TERM; sleep 3600 & wait"},
			}},
		},
	}
}

// latency is how long the steps of one lifecycle took.
type latency struct {
	running, gone, total time.Duration
}

// podLifecycle is one pod's life through the API server and the kubelet: created, Running,
// exec'd into and its log read through podgate's CRI socket, deleted and gone from the API.
func podLifecycle(ctx context.Context, client kubernetes.Interface, pods *podWatch, cri *rig.Client, node string, i int) (lat latency, err error) {
	name := fmt.Sprintf("soak-%d", i)
	start := time.Now()
	if _, err := client.CoreV1().Pods(namespace).Create(ctx, soakPod(name, node), metav1.CreateOptions{}); err != nil {
		return lat, fmt.Errorf("create pod %s: %w", name, err)
	}
	pod, err := pods.wait(ctx, name, "Running", func(p *corev1.Pod) (bool, error) {
		if p == nil {
			return false, nil
		}
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod %s: phase %s: %s", name, p.Status.Phase, p.Status.Message)
		}
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
				return false, fmt.Errorf("pod %s: container %s waiting: %s: %s", name, cs.Name, w.Reason, w.Message)
			}
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		return lat, err
	}
	lat.running = time.Since(start)
	if err := execAndLogs(ctx, cri, pod); err != nil {
		return lat, fmt.Errorf("pod %s: %w", name, err)
	}
	deleted := time.Now()
	grace := int64(graceSeconds)
	err = client.CoreV1().Pods(namespace).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: &grace,
		Preconditions:      metav1.NewUIDPreconditions(string(pod.UID)),
	})
	if err != nil {
		return lat, fmt.Errorf("delete pod %s: %w", name, err)
	}
	// The kubelet removes the pod from the API once it has stopped its containers.
	if _, err := pods.wait(ctx, name, "gone", func(p *corev1.Pod) (bool, error) { return p == nil || p.UID != pod.UID, nil }); err != nil {
		return lat, err
	}
	lat.gone, lat.total = time.Since(deleted), time.Since(start)
	return lat, nil
}

// execAndLogs runs a command in the pod's container and reads the container's log, both
// through podgate's CRI socket, as the kubelet's exec and log handlers would: the cluster's
// API server has no connection to the kubelet's streaming server.
func execAndLogs(ctx context.Context, cri *rig.Client, pod *corev1.Pod) error {
	ctrs, err := cri.Runtime.ListContainers(ctx, &runtimeapi.ContainerFilter{
		State:         &runtimeapi.ContainerStateValue{State: runtimeapi.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(pod.UID)},
	})
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	if len(ctrs) != 1 {
		return fmt.Errorf("%d running containers, want 1", len(ctrs))
	}
	id := ctrs[0].Id
	stdout, stderr, err := cri.Runtime.ExecSync(ctx, id, []string{"echo", "hi"}, 10*time.Second)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if string(stdout) != "hi\n" {
		return fmt.Errorf("exec: stdout %q, stderr %q, want stdout \"hi\\n\"", stdout, stderr)
	}
	st, err := cri.Runtime.ContainerStatus(ctx, id, false)
	if err != nil {
		return fmt.Errorf("container status: %w", err)
	}
	path := st.GetStatus().GetLogPath()
	if path == "" {
		return fmt.Errorf("container %s has no log path", id)
	}
	// The shell may not have written its line yet when the pod turns Running.
	return poll(ctx, 10*time.Second, 50*time.Millisecond, func() (bool, error) {
		b, err := os.ReadFile(path)
		return bytes.Contains(b, []byte("started")), err
	})
}

// podWatch follows the soak namespace's pods with an informer, so that many lifecycles wait on
// one watch rather than each polling the API server.
type podWatch struct {
	store cache.Store

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every event
}

func watchPods(ctx context.Context, client kubernetes.Interface) (*podWatch, error) {
	w := &podWatch{changed: make(chan struct{})}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace))
	inf := factory.Core().V1().Pods().Informer()
	notify := func() {
		w.mu.Lock()
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	})
	if err != nil {
		return nil, err
	}
	w.store = inf.GetStore()
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("watch pods: %v cache not synced", typ)
		}
	}
	return w, nil
}

// wait waits until cond holds for the pod (nil when it is not in the API), for podTimeout.
func (w *podWatch) wait(ctx context.Context, name, what string, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	timer := time.NewTimer(podTimeout)
	defer timer.Stop()
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		var pod *corev1.Pod
		obj, exists, err := w.store.GetByKey(namespace + "/" + name)
		if err != nil {
			return nil, err
		}
		if exists {
			pod = obj.(*corev1.Pod)
		}
		ok, err := cond(pod)
		if err != nil {
			return nil, err
		}
		if ok {
			return pod, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			status := "not in the API"
			if pod != nil {
				status = fmt.Sprintf("phase %s, deletion %v", pod.Status.Phase, pod.DeletionTimestamp)
			}
			return nil, errors.New("pod " + name + ": not " + what + " after " + podTimeout.String() + " (" + status + ")")
		}
	}
}

// count is the number of pods in the namespace.
func (w *podWatch) count() int { return len(w.store.ListKeys()) }

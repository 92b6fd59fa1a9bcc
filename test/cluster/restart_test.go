//go:build linux

package cluster_test

import (
	"context"
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// podState is what must not change across a podgate restart: the pod's sandbox and container
// IDs in containerd and the containers' restart counts in the API.
type podState struct {
	sandbox    string
	containers []string
	restarts   int32
}

func statePod(t *testing.T, n *node, pod *corev1.Pod) podState {
	t.Helper()
	p, err := n.cluster.Client().CoreV1().Pods(pod.Namespace).Get(t.Context(), pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := podState{}
	if sb := findSandbox(t, n.containerd, string(p.UID)); sb != nil {
		st.sandbox = sb.Id
	}
	ctrs, err := n.containerd.Runtime.ListContainers(t.Context(), &runtimeapi.ContainerFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.uid": string(p.UID)},
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ctrs {
		st.containers = append(st.containers, c.Id)
	}
	slices.Sort(st.containers)
	for _, cs := range p.Status.ContainerStatuses {
		st.restarts += cs.RestartCount
	}
	return st
}

// TestPodgateRestartUnderTheKubelet restarts podgate under a running kubelet, once with
// SIGTERM and once with SIGKILL: while it is down the kubelet's runtime calls fail with
// Unavailable, the kubelet recovers on its own once the socket is back, no pod is restarted
// (same sandbox and container IDs, same restart counts), the restarted podgate knows every
// running pod again, and a new pod starts through it.
func TestPodgateRestartUnderTheKubelet(t *testing.T) {
	n := startNode(t)
	_, ctx := ktesting.NewTestContext(t)
	client := n.cluster.Client()
	var pods []*corev1.Pod
	for _, name := range []string{"steady-a", "steady-b"} {
		pod := testPod(name, n.cluster.NodeName())
		if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitPod(t, n.cluster, pod.Namespace, pod.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
		pods = append(pods, pod)
	}
	before := map[string]podState{}
	for _, p := range pods {
		before[p.Name] = statePod(t, n, p)
	}

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			if sig == syscall.SIGTERM {
				if code, err := n.podgate.Stop(30 * time.Second); err != nil || code != 0 {
					t.Fatalf("podgate on SIGTERM: exit %d, %v", code, err)
				}
			} else {
				n.podgate.Kill()
			}
			// While podgate is down, a CRI call to its socket is Unavailable, at once.
			conn, err := grpc.NewClient(n.podgateEndpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err = runtimeapi.NewRuntimeServiceClient(conn).Version(callCtx, &runtimeapi.VersionRequest{})
			cancel()
			conn.Close()
			if status.Code(err) != codes.Unavailable {
				t.Errorf("Version with podgate down: %v, want Unavailable", err)
			}
			n.startPodgate(t)

			// The kubelet recovers on its own: a new pod runs through the new podgate.
			fresh := testPod(fmt.Sprintf("after-%s", map[syscall.Signal]string{syscall.SIGTERM: "term", syscall.SIGKILL: "kill"}[sig]), n.cluster.NodeName())
			if _, err := client.CoreV1().Pods(fresh.Namespace).Create(ctx, fresh, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			waitPod(t, n.cluster, fresh.Namespace, fresh.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

			for _, pod := range pods {
				got := statePod(t, n, pod)
				if want := before[pod.Name]; got.sandbox != want.sandbox || !slices.Equal(got.containers, want.containers) || got.restarts != want.restarts {
					t.Errorf("pod %s after podgate's %s restart: %+v, want %+v (nothing restarted)", pod.Name, sig, got, want)
				}
			}
			// The restarted podgate knows every running pod (podgateList fails the test otherwise).
			podgateList(t, n, append(slices.Clone(pods), fresh)...)
		})
	}
}

// podgateList returns the pods podgate's PodResources extension knows, by namespace/name. It
// waits until podgate knows every pod in want with a ready sandbox: podgate rebuilds its registry
// from the runtime in the background after it starts.
func podgateList(t *testing.T, n *node, want ...*corev1.Pod) map[string]*pb.Pod {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+n.podgate.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	out := map[string]*pb.Pod{}
	waitFor(t, 30*time.Second, "podgate to know the running pods", func() (bool, error) {
		resp, err := pb.NewPodResourcesClient(conn).List(t.Context(), &pb.ListRequest{}, grpc.WaitForReady(true))
		if err != nil {
			return false, err
		}
		clear(out)
		for _, p := range resp.GetPods() {
			out[p.GetNamespace()+"/"+p.GetName()] = p
		}
		for _, p := range want {
			if out[p.Namespace+"/"+p.Name].GetSandbox().GetState() != pb.Sandbox_READY {
				return false, fmt.Errorf("pod %s/%s: %v", p.Namespace, p.Name, out[p.Namespace+"/"+p.Name].GetSandbox())
			}
		}
		return true, nil
	})
	return out
}

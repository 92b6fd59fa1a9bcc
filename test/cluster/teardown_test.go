//go:build linux

package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/rig"
)

// teardownTimeout bounds each wait of a teardown: the kubelet's StopPodSandbox calls (a burst's
// 20 multus DELs on two shared cores), and a removal that containerd refuses until the kubelet's
// last removal of a container has ended.
const teardownTimeout = 2 * time.Minute

// containerBeingRemoved is containerd's refusal to remove a container that another call is
// removing at that moment (internal/cri/server/container_remove.go, setContainerRemoving); the
// call that holds it either removes the container or, failing, gives it back.
const containerBeingRemoved = "is already in removing state"

// teardownPods deletes the pods of the default namespace, lets the kubelet stop their
// sandboxes, then removes the sandboxes, as the kubelet's container garbage collection would a
// minute later, while the API server is still there (multus's DEL asks it for the pod). It runs
// in a cleanup, when the test's context is done, and leaves the kubelet stopped.
//
// The kubelet and the test must never act on one sandbox at the same time: containerd does not
// serialise the calls that stop a sandbox (StopPodSandbox, and RemovePodSandbox, which stops
// first). Each runs CNI DEL while the network namespace is open; when one removes the namespace
// (unmount, then unlink) as the other's plugin opens it, the plugin finds a plain file and the
// call fails (`plugin type="bridge" failed (delete): unknown FS magic on ".../netns/cni-...":
// ef53`), and a RemoveContainer meeting the kubelet's own removal of that container fails
// ("container is already in removing state"). So:
//
//  1. the pods are deleted (grace period 0), and the kubelet stops their sandboxes;
//  2. the wait is for the end of each StopPodSandbox (waitStopped): containerd reports a
//     sandbox NOTREADY as soon as its pause process exits, before CNI DEL runs, and closes its
//     network namespace last, after CNI DEL;
//  3. the kubelet is stopped, so that neither its garbage collection (StopPodSandbox then
//     RemovePodSandbox of a deleted pod's stopped sandboxes, once a minute) nor its container
//     deletor can meet the removals;
//  4. each sandbox is stopped and removed through podgate (removeSandbox), as the kubelet's
//     garbage collection would.
func (n *node) teardownPods(t testing.TB) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*teardownTimeout)
	defer cancel()
	err := n.cluster.Client().CoreV1().Pods(metav1.NamespaceDefault).DeleteCollection(ctx,
		metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	if err != nil {
		t.Errorf("delete the pods: %v", err)
		return
	}
	start := time.Now()
	// Without a kubelet (a test stopped it) nobody else acts on the sandboxes: the removals
	// below stop them.
	if n.cluster.KubeletRunning() {
		if err := waitStopped(ctx, n.containerd.Runtime, nil); err != nil {
			t.Errorf("the kubelet did not stop the pods' sandboxes: %v", err)
			return
		}
	}
	stopped := time.Since(start)
	if err := n.cluster.StopKubelet(ctx); err != nil {
		t.Errorf("stop the kubelet before removing the sandboxes: %v", err)
		return
	}
	pg, err := rig.Dial(ctx, n.podgate.Endpoint)
	if err != nil {
		t.Errorf("podgate: %v", err)
		return
	}
	defer func() {
		if err := pg.Close(ctx); err != nil {
			t.Errorf("close the CRI client of podgate: %v", err)
		}
	}()
	sbs, err := pg.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		t.Errorf("list the sandboxes: %v", err)
		return
	}
	start, retries := time.Now(), 0
	for _, sb := range sbs {
		r, err := removeSandbox(ctx, pg.Runtime, sb.GetId())
		retries += r
		if err != nil {
			t.Errorf("remove the sandbox of %s: %v", sb.GetMetadata().GetName(), err)
		}
	}
	t.Logf("teardown: the kubelet stopped the pods' sandboxes in %s; %d removed through podgate in %s, %d removals tried again for a container containerd was still removing",
		stopped.Round(time.Millisecond), len(sbs), time.Since(start).Round(time.Millisecond), retries)
}

// removeSandbox stops and removes a sandbox, Stop before Remove as the kubelet does. A removal
// refused because a container of the sandbox "is already in removing state" is tried again
// until containerd has let the container go: the kubelet's last RemoveContainer, stopped with
// the kubelet, was still under way in containerd. Any other error ends it. retries counts the
// refusals.
func removeSandbox(ctx context.Context, rs internalapi.RuntimeService, id string) (retries int, _ error) {
	var last error
	tries := 0
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, teardownTimeout, true, func(ctx context.Context) (bool, error) {
		tries++
		last = rs.StopPodSandbox(ctx, id)
		if last == nil {
			last = rs.RemovePodSandbox(ctx, id)
		}
		switch {
		case last == nil:
			return true, nil
		case strings.Contains(last.Error(), containerBeingRemoved):
			return false, nil
		default:
			return false, last
		}
	})
	if wait.Interrupted(err) {
		return tries - 1, fmt.Errorf("%w; last: %w", err, last)
	}
	return tries - 1, err
}

// waitStopped waits until every sandbox of the runtime rs that filter selects (nil: all) has
// been stopped to the end (stoppedToTheEnd), or teardownTimeout passes; the error names the
// sandboxes still being stopped, and why.
func waitStopped(ctx context.Context, rs internalapi.RuntimeService, filter *runtimeapi.PodSandboxFilter) error {
	done := map[string]bool{} // a closed namespace stays closed: each sandbox is asked until it is
	var left []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, teardownTimeout, true, func(ctx context.Context) (bool, error) {
		sbs, err := rs.ListPodSandbox(ctx, filter)
		if err != nil {
			left = []string{"list: " + err.Error()}
			return false, nil // containerd may be busy: ask again
		}
		left = left[:0]
		for _, sb := range sbs {
			if done[sb.GetId()] {
				continue
			}
			if ok, why := stoppedToTheEnd(ctx, rs, sb); ok {
				done[sb.GetId()] = true
			} else {
				left = append(left, sb.GetMetadata().GetName()+": "+why)
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("%w after %s; still being stopped: %s", err, teardownTimeout, strings.Join(left, "; "))
	}
	return nil
}

// stoppedToTheEnd reports whether the last StopPodSandbox of sb has finished: the sandbox is
// not ready and containerd has closed its network namespace, which it does after CNI DEL
// returned (or it is gone, or on the node's network, with no namespace of its own). Otherwise
// it says why not.
func stoppedToTheEnd(ctx context.Context, rs internalapi.RuntimeService, sb *runtimeapi.PodSandbox) (bool, string) {
	if sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY {
		return false, "ready"
	}
	st, err := rs.PodSandboxStatus(ctx, sb.GetId(), true)
	if status.Code(err) == codes.NotFound {
		return true, ""
	}
	if err != nil {
		return false, "status: " + err.Error()
	}
	if st.GetStatus().GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE {
		return true, ""
	}
	// containerd's verbose sandbox information (internal/cri/server/podsandbox/types).
	var info struct {
		NetNSClosed bool `json:"netNamespaceClosed"`
	}
	if err := json.Unmarshal([]byte(st.GetInfo()["info"]), &info); err != nil {
		return false, fmt.Sprintf("containerd's verbose status %q: %v", st.GetInfo()["info"], err)
	}
	if !info.NetNSClosed {
		return false, "not ready, its network namespace still open: StopPodSandbox in CNI DEL"
	}
	return true, ""
}

//go:build linux

package cluster_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// podsAPISocket is where the cluster's kubelet serves its Pods API (kubelet 1.37, feature gate
// PodsAPI, on by default): <root-dir>/pods-api/pods-api.sock.
func podsAPISocket(c *cluster.Cluster) string {
	return filepath.Join(c.KubeletRootDir(), "pods-api", "pods-api.sock")
}

// TestPodsFromKubeletPodsAPI runs pods through a real kubelet 1.37 on podgate, which is
// configured with the kubelet's Pods API socket: once podgate has switched to it (podgate
// starts before the kubelet, so it begins with the API server), a pod start makes no pod
// request to the API server by podgate's user agent (kube-apiserver's audit log), and a pod
// deleted while its pull waits in podgate's queue gets its cancellation Event, as with the API
// server as the source (TestPullEvents): the kubelet cancels the stopping pod's PullImage
// before the Pods API tells the deletion (with the pod's next status change), and podgate
// names the cancelled pull when it does.
func TestPodsFromKubeletPodsAPI(t *testing.T) {
	skipBeforePodsAPI(t)
	n := startNodeOf(t, true, cluster.Options{KubeletConfig: parallelPulls, AuditLog: true}, func(c *cluster.Cluster) string {
		return pullEventsConfig + "kubeletPodsAPISocket: " + podsAPISocket(c) + "\n"
	}, rig.Options{})
	c := n.cluster
	waitPodsAPISource(t, n)
	if !strings.Contains(n.podgate.Log.String(), "The node's pods come from the kubelet's Pods API") {
		t.Errorf("podgate did not log that its pods come from the kubelet's Pods API")
	}
	since := time.Now()

	started := createPod(t, c, testPod("started", c.NodeName()))
	waitPod(t, c, started.Namespace, started.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	reqs, err := cluster.ReadAudit(c.AuditLogPath())
	if err != nil {
		t.Fatal(err)
	}
	var podgateReqs, podReqs []string
	for _, r := range reqs {
		if clientOf(r.UserAgent) != clientPodgate || r.Received.Before(since) {
			continue
		}
		line := fmt.Sprintf("%s %s %s/%s (%d)", r.Verb, r.Resource, r.Namespace, r.Name, r.Code)
		podgateReqs = append(podgateReqs, line)
		if r.Resource == "pods" {
			podReqs = append(podReqs, line)
		}
	}
	t.Logf("podgate's requests to the API server since the switch:\n%s", strings.Join(podgateReqs, "\n"))
	if len(podReqs) != 0 {
		t.Errorf("podgate made %d pod requests to the API server with the kubelet's Pods API serving:\n%s",
			len(podReqs), strings.Join(podReqs, "\n"))
	}

	// A pull held at the registry takes the one slot; the deleted pod's pull waits behind it.
	reg := registry.New(8 << 20)
	reg.Serve(t)
	imgs := reg.Push(t, "podsapi/img", 2, 64<<10)
	reg.Count(true)
	reg.Hold()
	defer reg.Release()
	blocker := createPod(t, c, pullingPod("blocker", c.NodeName(), imgs[0]))
	waitEvent(t, c, blocker, "PullProgress")
	deleted := createPod(t, c, pullingPod("deleted", c.NodeName(), imgs[1]))
	waitEvent(t, c, deleted, "PullQueued", imgs[1], "place 1 of 1")
	var zero int64
	if err := c.Client().CoreV1().Pods(deleted.Namespace).Delete(t.Context(), deleted.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, deleted, "PullCancelled", imgs[1], "while it waited in podgate's queue; it never reached the runtime")
	if v, _ := n.podgate.Scrape(t.Context()); v != nil {
		if src, _ := v.Value("podgate_kube_pod_source", "source", "kubelet-pods-api"); src != 1 {
			t.Errorf("podgate left the kubelet's Pods API during the test")
		}
	}
}

// TestPodLookupsWithoutAPIServer: with the API server unreachable (frozen), podgate's pod
// lookups still answer from the kubelet's Pods API: of three static pods' pulls behind a cap of
// one, the system-node-critical pod's, asked last, starts before the normal pod's. Its priority
// comes from the pod (the sandbox config does not carry it), so a lookup that went to the API
// server would have ranked it normal.
func TestPodLookupsWithoutAPIServer(t *testing.T) {
	skipBeforePodsAPI(t)
	manifests := t.TempDir()
	kubeletConfig := map[string]any{"serializeImagePulls": false, "staticPodPath": manifests, "fileCheckFrequency": "1s"}
	n := startNodeOf(t, true, cluster.Options{KubeletConfig: kubeletConfig}, func(c *cluster.Cluster) string {
		return "imagePulls:\n  maxParallel: 1\nkubeletPodsAPISocket: " + podsAPISocket(c) + "\n"
	}, rig.Options{})
	c := n.cluster
	waitPodsAPISource(t, n)

	reg := registry.New(8 << 20)
	reg.Serve(t)
	imgs := reg.Push(t, "static/img", 3, 64<<10)
	reg.Count(true)
	reg.Hold()
	defer reg.Release()
	writeStatic := func(name, image, class string) {
		pod := pullingPod(name, "", image)
		pod.TypeMeta = metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}
		pod.Spec.PriorityClassName = class
		b, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(manifests, name+".json")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		// The kubelet stops a static pod whose manifest is gone; the cluster's Down does the rest.
		t.Cleanup(func() { _ = os.Remove(path) })
	}
	logHas := func(what string, parts ...string) {
		waitFor(t, 2*time.Minute, what, func() (bool, error) {
			for line := range strings.SplitSeq(n.podgate.Log.String(), "\n") {
				if containsAll(line, parts...) {
					return true, nil
				}
			}
			return false, nil
		})
	}
	writeStatic("static-first", imgs[0], "")
	logHas("the first static pod's pull running", `"Image pull started"`, `image="`+imgs[0]+`"`)

	thaw, err := c.FreezeAPIServer()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := thaw(); err != nil {
			t.Error(err)
		}
	}()
	writeStatic("static-normal", imgs[1], "")
	logHas("the normal static pod's pull queued", `"Image pull waits"`, `image="`+imgs[1]+`"`, `priority="normal"`)
	writeStatic("static-critical", imgs[2], "system-node-critical")
	logHas("the critical static pod's pull queued, ranked from its pod", `"Image pull waits"`, `image="`+imgs[2]+`"`, `priority="system-node-critical"`)
	reg.Release()
	logHas("the normal static pod's pull running", `"Image pull started"`, `image="`+imgs[1]+`"`)
	log := n.podgate.Log.String()
	critical := strings.Index(log, `"Image pull started" image="`+imgs[2]+`"`)
	normal := strings.Index(log, `"Image pull started" image="`+imgs[1]+`"`)
	if critical < 0 || critical > normal {
		t.Errorf("the system-node-critical pod's pull, asked last, did not start before the normal pod's (log offsets %d, %d)", critical, normal)
	}
}

// skipBeforePodsAPI skips a test on a kubelet older than 1.37, which serves no Pods API.
func skipBeforePodsAPI(t *testing.T) {
	t.Helper()
	if v := os.Getenv(cluster.KubeletVersionEnv); v != "" {
		if kv, err := utilversion.ParseGeneric(v); err == nil && kv.LessThan(utilversion.MajorMinor(1, 37)) {
			t.Skipf("%s=%s: the kubelet serves its Pods API from 1.37 on", cluster.KubeletVersionEnv, v)
		}
	}
}

// waitPodsAPISource waits until podgate learns the node's pods from the kubelet's Pods API,
// and skips the test when the kubelet serves none.
func waitPodsAPISource(t *testing.T, n *node) {
	t.Helper()
	socket := podsAPISocket(n.cluster)
	if !socketWithin(t, socket, 30*time.Second) {
		t.Skipf("the cluster's kubelet (%s=%q) serves no Pods API at %s: older than 1.37, or its PodsAPI gate off",
			cluster.KubeletVersionEnv, os.Getenv(cluster.KubeletVersionEnv), socket)
	}
	waitFor(t, time.Minute, "podgate's pods from the kubelet's Pods API", func() (bool, error) {
		m, err := n.podgate.Scrape(t.Context())
		if err != nil {
			return false, err
		}
		v, _ := m.Value("podgate_kube_pod_source", "source", "kubelet-pods-api")
		return v == 1, nil
	})
}

// containsAll reports whether s contains every part.
func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// socketWithin reports whether path is a unix socket, waiting up to timeout for it: the
// kubelet creates its sockets as it starts.
func socketWithin(t testing.TB, path string, timeout time.Duration) bool {
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		fi, err := os.Stat(path)
		return err == nil && fi.Mode().Type() == os.ModeSocket, nil
	})
	return err == nil
}

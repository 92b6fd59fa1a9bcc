//go:build linux

package cluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/podgate/podgate/test/cluster"
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
// request to the API server by podgate's user agent (kube-apiserver's audit log).
//
// Not asserted, because it does not hold: a pod deleted while its pull waits in podgate's
// queue had its pull cancelled with the API server as the source (TestPullEvents), not with the
// Pods API, which tells a deletion only with the kubelet's next status change of the pod (the
// kubelet 1.37.2's status manager notifies its Pods API server). Hence kubeletPodsAPISocket is
// opt-in.
func TestPodsFromKubeletPodsAPI(t *testing.T) {
	if v := os.Getenv(cluster.KubeletVersionEnv); v != "" {
		if kv, err := utilversion.ParseGeneric(v); err == nil && kv.LessThan(utilversion.MajorMinor(1, 37)) {
			t.Skipf("%s=%s: the kubelet serves its Pods API from 1.37 on", cluster.KubeletVersionEnv, v)
		}
	}
	n := startNodeOf(t, true, cluster.Options{KubeletConfig: parallelPulls, AuditLog: true}, func(c *cluster.Cluster) string {
		return pullEventsConfig + "kubeletPodsAPISocket: " + podsAPISocket(c) + "\n"
	}, rig.Options{})
	c := n.cluster
	socket := podsAPISocket(c)
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
}

// socketWithin reports whether path is a unix socket, waiting up to timeout for it: the
// kubelet creates its sockets as it starts.
func socketWithin(t *testing.T, path string, timeout time.Duration) bool {
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		fi, err := os.Stat(path)
		return err == nil && fi.Mode().Type() == os.ModeSocket, nil
	})
	return err == nil
}

//go:build linux

package cluster_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podgate/podgate/test/procstat"
)

// rssPods is the kubelet's default maxPods: a node full of pods.
const rssPods = 110

// BenchmarkRSS110PodsKubelet measures podgate's memory on a node whose real kubelet runs 110
// pods through it, with everything on that such a node has: the pod informer and the Kubernetes
// client, the PodResources servers, the DRA driver watch, the registry and its checkpoint.
// podgate's binary is dropped from the page cache before it starts, as after a reboot. Once every
// pod runs, podgate's memory is sampled once a second for 10 s, while the kubelet relists and
// reads statuses through it; the largest sample is reported, with the idle figures before the
// first pod. Run it with -benchtime 1x.
//
//	go test -run '^$' -bench RSS110PodsKubelet -benchtime 1x -count 3 ./test/cluster
func BenchmarkRSS110PodsKubelet(b *testing.B) {
	if podgateBin != "" {
		if err := procstat.DropFromPageCache(podgateBin); err != nil {
			b.Fatal(err)
		}
	}
	n := startNode(b)
	idle, err := procstat.Memory(n.podgate.PID())
	if err != nil {
		b.Fatal(err)
	}
	client := n.cluster.Client()
	peak := map[string]float64{}
	for iter := 0; b.Loop(); iter++ {
		start := time.Now()
		for i := range rssPods {
			pod := testPod(fmt.Sprintf("rss-%d-%d", iter, i), n.cluster.NodeName())
			if _, err := client.CoreV1().Pods(pod.Namespace).Create(b.Context(), pod, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		waitFor(b, 10*time.Minute, fmt.Sprintf("%d pods running", rssPods), func() (bool, error) {
			return countPods(b, n, corev1.PodRunning) == rssPods, nil
		})
		b.ReportMetric(time.Since(start).Seconds(), "all-running-s")
		for range 10 {
			mem, err := procstat.Memory(n.podgate.PID())
			if err != nil {
				b.Fatal(err)
			}
			for k, v := range mem {
				peak[k] = max(peak[k], v)
			}
			time.Sleep(time.Second) // a sampling interval: the kubelet relists once a second
		}
		b.StopTimer()
		if err := client.CoreV1().Pods(metav1.NamespaceDefault).DeleteCollection(b.Context(), *metav1.NewDeleteOptions(0), metav1.ListOptions{}); err != nil {
			b.Fatal(err)
		}
		waitFor(b, 10*time.Minute, "every pod gone", func() (bool, error) { return countPods(b, n, "") == 0, nil })
		b.StartTimer()
	}
	b.ReportMetric(peak["VmRSS"], "vmrss-MiB")
	b.ReportMetric(peak["RssAnon"], "rssanon-MiB")
	b.ReportMetric(peak["RssFile"], "rssfile-MiB")
	b.ReportMetric(idle["VmRSS"], "idle-vmrss-MiB")
}

// countPods counts the pods in the default namespace in phase, or all of them for "".
func countPods(b *testing.B, n *node, phase corev1.PodPhase) int {
	b.Helper()
	list, err := n.cluster.Client().CoreV1().Pods(metav1.NamespaceDefault).List(b.Context(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	count := 0
	for _, p := range list.Items {
		if phase == "" || p.Status.Phase == phase {
			count++
		}
	}
	return count
}

//go:build linux

package cluster_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// imageVolumePod is a pod whose only pull is an image volume's: its container runs the rig's
// local busybox (never pulled) with image mounted at /data.
func imageVolumePod(name, node, image string) *corev1.Pod {
	pod := testPod(name, node)
	pod.Spec.Volumes = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
		Image: &corev1.ImageVolumeSource{Reference: image, PullPolicy: corev1.PullIfNotPresent},
	}}}
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	return pod
}

// podPulls asks podgate's PodResources extension for the pod's pulls.
func podPulls(t *testing.T, n *node, pod *corev1.Pod) []*pb.ImagePull {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+n.podgate.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := pb.NewPodResourcesClient(conn).PodPulls(t.Context(), &pb.PodPullsRequest{PodNamespace: pod.Namespace, PodName: pod.Name}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetPulls()
}

// TestImageVolumePulls: an image volume's pull (ImageVolume, GA in the kubelet 1.36) is governed
// like a container image's. Behind a pull holding podgate's only slot (imagePulls.maxParallel
// 1), the image volumes of two pods queue in podgate, each attributed to its pod: a PullQueued
// Event on that pod, and that pod's entry in the PodResources extension's PodPulls, QUEUED with
// its place. The pod deleted while its pull waits has the pull cancelled (PullCancelled, never
// reached the runtime); the other's runs once the slot frees, and its pod starts with the
// volume mounted.
func TestImageVolumePulls(t *testing.T) {
	skipKubeletBefore(t, 1, 36, "image volumes are GA from 1.36")
	n := startNodeConfigured(t, true, parallelPulls, pullEventsConfig, rig.Options{})
	c := n.cluster
	reg := registry.New(2 << 20)
	reg.Serve(t)
	big := reg.Push(t, "volumes/big", 1, 8<<20)[0]
	small := reg.Push(t, "volumes/small", 2, 64<<10)
	reg.Count(true)

	running := createPod(t, c, pullingPod("holds-the-slot", c.NodeName(), big))
	waitFor(t, 2*time.Minute, "the big layer's download", func() (bool, error) {
		s := reg.Stats()
		return len(s.BlobGets) >= 2, fmt.Errorf("registry: %+v", s)
	})
	reg.Pause() // the big pull stays in flight until the volumes' pulls are lined up
	defer reg.Resume()
	waiting := createPod(t, c, imageVolumePod("volume-waits", c.NodeName(), small[0]))
	waitEvent(t, c, waiting, "PullQueued", small[0], "imagePulls.maxParallel 1, 1 running", "place 1 of 1")
	deleted := createPod(t, c, imageVolumePod("volume-deleted", c.NodeName(), small[1]))
	waitEvent(t, c, deleted, "PullQueued", small[1], "place 2 of 2")
	for _, tc := range []struct {
		pod   *corev1.Pod
		image string
		place uint32
	}{{waiting, small[0], 1}, {deleted, small[1], 2}} {
		pulls := podPulls(t, n, tc.pod)
		if len(pulls) != 1 || pulls[0].GetImage() != tc.image || pulls[0].GetState() != pb.ImagePull_QUEUED ||
			pulls[0].GetPosition() != tc.place || pulls[0].GetPodUid() != string(tc.pod.UID) {
			t.Errorf("PodPulls of %s: %v; want its image volume %s queued, place %d", tc.pod.Name, pulls, tc.image, tc.place)
		}
	}

	var zero int64
	if err := c.Client().CoreV1().Pods(deleted.Namespace).Delete(t.Context(), deleted.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, c, deleted, "PullCancelled", small[1], "while it waited in podgate's queue; it never reached the runtime")
	reg.Resume()
	waitPod(t, c, running.Namespace, running.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	waitPod(t, c, waiting.Namespace, waiting.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if got := reg.Stats().BlobGets; blobGetsOf(got, "volumes/small/img1") != 0 {
		t.Errorf("the deleted pod's image volume was downloaded: %v", got)
	}
}

// blobGetsOf counts the blob GETs of repo in a registry's BlobGets (keyed repo@digest).
func blobGetsOf(gets map[string]int, repo string) int {
	n := 0
	for k, v := range gets {
		if len(k) > len(repo) && k[:len(repo)+1] == repo+"@" {
			n += v
		}
	}
	return n
}

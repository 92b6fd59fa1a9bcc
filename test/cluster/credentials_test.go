//go:build linux

package cluster_test

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// pullSecret makes a kubernetes.io/dockerconfigjson Secret for host with these credentials.
func pullSecret(t *testing.T, c *cluster.Cluster, name, host, user, password string) {
	t.Helper()
	cfg, err := json.Marshal(map[string]any{"auths": map[string]any{host: map[string]string{
		"username": user, "password": password, "auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password)),
	}}})
	if err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Type:       corev1.SecretTypeDockerConfigJson,
		Data:       map[string][]byte{corev1.DockerConfigJsonKey: cfg},
	}
	if _, err := c.Client().CoreV1().Secrets(s.Namespace).Create(t.Context(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// pullFailed tells a pod whose container is waiting for want of its image.
func pullFailed(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
			return true
		}
	}
	return false
}

// TestPullCredentialsNotShared: with KubeletEnsureSecretPulledImages (beta and on in the
// kubelet 1.36 and 1.37), a pod without the credentials for a private image is not started
// with another pod's pull of it. Pod A, with an imagePullSecret, pulls a private image of the
// test registry (basic auth), its download held part-way; pod B, on the same node without
// credentials, asks for the same image meanwhile: podgate shares pulls only between callers of
// the same credentials (a hash of them in the flight key), so B's PullImage goes to containerd
// on its own, with no credentials, and the registry refuses it: B shows ErrImagePull, and
// podgate counts no shared pull. Once A's pull is done and A runs, pod C without credentials
// is not started from the image on the node either: the kubelet asks for a pull again, which
// the registry refuses.
func TestPullCredentialsNotShared(t *testing.T) {
	skipKubeletBefore(t, 1, 36, "the test expects KubeletEnsureSecretPulledImages on, its default from 1.36 in podgate's matrix")
	n := startNodeConfigured(t, true, parallelPulls, "", rig.Options{})
	c := n.cluster
	reg := registry.New(0, registry.WithBasicAuth("private/", "puller", "pull-secret"))
	reg.Serve(t)
	image := reg.Push(t, "private/app", 1, 256<<10)[0]
	pullSecret(t, c, "registry-creds", reg.Host, "puller", "pull-secret")
	reg.Count(true)
	reg.Hold() // A's download stays in flight until B has been answered
	defer reg.Release()

	a := pullingPod("with-secret", c.NodeName(), image)
	a.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "registry-creds"}}
	a = createPod(t, c, a)
	waitFor(t, 2*time.Minute, "A's download under way", func() (bool, error) {
		s := reg.Stats()
		return len(s.BlobGets) >= 1, fmt.Errorf("registry: %+v", s)
	})
	refusedBefore := reg.Unauthorized()
	b := createPod(t, c, pullingPod("without-secret", c.NodeName(), image))
	b = waitPod(t, c, b.Namespace, b.Name, pullFailed)
	if reg.Unauthorized() == refusedBefore {
		t.Errorf("the registry refused no request while B pulled: B's pull never reached it without credentials")
	}
	dedup := func() float64 {
		t.Helper()
		m, err := n.podgate.Scrape(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		v, _ := m.Value("podgate_image_pull_deduplicated_total", "kind", "image")
		return v
	}
	if v := dedup(); v != 0 {
		t.Errorf("podgate_image_pull_deduplicated_total = %v while A pulled and B failed, want 0: B joined A's pull", v)
	}

	// containerd 2.4 says of the 401: "pull access denied, … authorization failed: no basic
	// auth credentials".
	if msg := waitingMessage(b); !strings.Contains(msg, "no basic auth credentials") {
		t.Errorf("B's pull failed with %q, want containerd's answer to the registry's 401 without credentials", msg)
	}

	reg.Release()
	waitPod(t, c, a.Namespace, a.Name, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	// B goes, so that its pull retries do not count as C's.
	var zero int64
	if err := c.Client().CoreV1().Pods(b.Namespace).Delete(t.Context(), b.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "B gone", func() (bool, error) {
		_, err := c.Client().CoreV1().Pods(b.Namespace).Get(t.Context(), b.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
	refusedBefore = reg.Unauthorized()
	cPod := createPod(t, c, pullingPod("after-without-secret", c.NodeName(), image))
	waitPod(t, c, cPod.Namespace, cPod.Name, pullFailed)
	if reg.Unauthorized() == refusedBefore {
		t.Errorf("C, without credentials, failed without a refused request at the registry")
	}
	if v := dedup(); v != 0 {
		t.Errorf("podgate_image_pull_deduplicated_total = %v, want 0", v)
	}
	got, err := c.Client().CoreV1().Pods(cPod.Namespace).Get(t.Context(), cPod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase == corev1.PodRunning {
		t.Errorf("pod %s, without credentials, runs the private image", cPod.Name)
	}
	t.Logf("B: %s; C: %s", waitingMessage(b), waitingMessage(got))
}

// waitingMessage is why the pod's first waiting container waits.
func waitingMessage(p *corev1.Pod) string {
	for _, s := range p.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil {
			return w.Reason + ": " + w.Message
		}
	}
	return ""
}

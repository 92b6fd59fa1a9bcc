package crifixture

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// id is a 64-hex-digit ID as containerd makes them, the same for the same seed.
func id(seed string) string {
	sum := sha256.Sum256([]byte(seed))
	return hex.EncodeToString(sum[:])
}

// PodUID is the UID of pod i, as the kubelet's labels carry it.
func PodUID(i int) string {
	h := id(fmt.Sprint("pod-", i))
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// SandboxID is the ID of pod i's sandbox.
func SandboxID(i int) string { return id(fmt.Sprint("sandbox-", i)) }

// ContainerID is the ID of pod i's container j.
func ContainerID(i, j int) string { return id(fmt.Sprint("container-", i, "-", j)) }

// Sandbox is pod i's ready sandbox, labelled and annotated as the kubelet does.
func Sandbox(i int) *runtimeapi.PodSandbox {
	name, ns := fmt.Sprintf("web-%d-7f9c8d6b5-x2k4p", i), "team-"+strconv.Itoa(i%10)
	return &runtimeapi.PodSandbox{
		Id:       SandboxID(i),
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Uid: PodUID(i), Namespace: ns},
		State:    runtimeapi.PodSandboxState_SANDBOX_READY,
		Labels: map[string]string{
			"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.uid": PodUID(i),
			"app": "web", "pod-template-hash": "7f9c8d6b5",
		},
		Annotations: map[string]string{
			"kubernetes.io/config.seen":   "2026-11-27T21:52:33.123456789Z",
			"kubernetes.io/config.source": "api",
		},
		CreatedAt:      1795816353123456789 + int64(i),
		RuntimeHandler: "runc",
	}
}

// Container is pod i's running container j, labelled and annotated as the kubelet does (about
// 830 bytes marshalled: 30,000 of them are more than one 16 MiB message).
func Container(i, j int) *runtimeapi.Container {
	sb := Sandbox(i)
	name := fmt.Sprintf("app-%d", j)
	image := "registry.example.com/team/web-frontend@sha256:" + id(fmt.Sprint("image-", j%3))
	return &runtimeapi.Container{
		Id:           ContainerID(i, j),
		PodSandboxId: sb.Id,
		Metadata:     &runtimeapi.ContainerMetadata{Name: name, Attempt: 0},
		Image:        &runtimeapi.ImageSpec{Image: image},
		ImageRef:     image,
		State:        runtimeapi.ContainerState_CONTAINER_RUNNING,
		CreatedAt:    sb.CreatedAt + int64(j+1),
		Labels: map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       sb.Metadata.Name,
			"io.kubernetes.pod.namespace":  sb.Metadata.Namespace,
			"io.kubernetes.pod.uid":        sb.Metadata.Uid,
		},
		Annotations: map[string]string{
			"io.kubernetes.container.hash":                     "5c3b0e1a",
			"io.kubernetes.container.restartCount":             "0",
			"io.kubernetes.container.terminationMessagePath":   "/dev/termination-log",
			"io.kubernetes.container.terminationMessagePolicy": "File",
			"io.kubernetes.pod.terminationGracePeriod":         "30",
		},
	}
}

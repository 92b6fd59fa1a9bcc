package registry

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// rebuildAttemptTimeout bounds one rebuild attempt: a list and a status call per sandbox,
// which containerd answers from memory.
const rebuildAttemptTimeout = time.Minute

// Rebuild lists the runtime's sandboxes, reads each one's status, and reconciles the registry
// with them (see reconcile): known is how many the runtime has, added how many the registry
// did not know (adopted), dropped how many it knew that the runtime no longer has. One attempt,
// bounded in time; the caller retries.
func (reg *Registry) Rebuild(ctx context.Context, rt runtimeapi.RuntimeServiceClient) (known, added, dropped int, err error) {
	ctx, cancel := context.WithTimeout(ctx, rebuildAttemptTimeout)
	defer cancel()
	end := reg.beginRebuild()
	defer end()
	resp, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("list sandboxes: %w", err)
	}
	seen := make([]SandboxRecord, 0, len(resp.GetItems()))
	for _, sb := range resp.GetItems() {
		rec := recordFromRuntime(ctx, rt, sb)
		if rec.gone {
			continue // removed between the list and its status
		}
		seen = append(seen, rec.SandboxRecord)
	}
	containers, err := listContainers(ctx, rt, seen)
	if err != nil {
		return 0, 0, 0, err
	}
	added, dropped = reg.reconcile(seen, containers)
	return len(seen), added, dropped, nil
}

// listContainers reads the runtime's containers that have a cgroup to verify (created or
// running; an exited container's cgroup is gone) with what their runtime spec asks, as adopted
// records. A container removed between the list and its status is left out.
func listContainers(ctx context.Context, rt runtimeapi.RuntimeServiceClient, sandboxes []SandboxRecord) ([]ContainerRecord, error) {
	resp, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	pods := make(map[string]types.UID, len(sandboxes))
	for i := range sandboxes {
		pods[sandboxes[i].ID] = sandboxes[i].Pod.UID
	}
	var out []ContainerRecord
	for _, c := range resp.GetContainers() {
		verification := CgroupUnverified
		switch c.GetState() {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
		case runtimeapi.ContainerState_CONTAINER_CREATED:
			verification = CgroupPending
		default:
			continue
		}
		rec := ContainerRecord{
			ID: c.GetId(), Name: c.GetMetadata().GetName(), SandboxID: c.GetPodSandboxId(),
			PodUID: cmp.Or(pods[c.GetPodSandboxId()], types.UID(c.GetLabels()[podUIDLabel])),
			Origin: OriginAdopted, Verification: verification,
		}
		spec, err := containerSpec(ctx, rt, c.GetId())
		switch {
		case status.Code(err) == codes.NotFound:
			continue // removed meanwhile
		case err != nil:
			rec.Error = err.Error() // verified, and so retried, at the next recheck
		default:
			rec.Asked, rec.CgroupsPath = spec.Linux.Resources, spec.Linux.CgroupsPath
		}
		out = append(out, rec)
	}
	return out, nil
}

// podUIDLabel is the label the kubelet puts on every container with its pod's UID.
const podUIDLabel = "io.kubernetes.pod.uid"

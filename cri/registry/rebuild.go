package registry

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// A rebuild attempt is bounded in time: the lists within listTimeout, then the status calls, a
// call per sandbox and per live container, which containerd answers from memory, within
// statusBudget plus perItemBudget for each (a full node of 30,000 containers gets about three
// minutes; at statusWorkers calls at a time an idle containerd answers them in seconds).
const (
	listTimeout   = time.Minute
	statusBudget  = time.Minute
	perItemBudget = 5 * time.Millisecond
	// statusWorkers is how many status calls a rebuild keeps open at once: enough to hide the
	// round trips, few enough not to crowd out the kubelet's calls during podgate's start-up.
	statusWorkers = 8
)

// Rebuild lists the runtime's sandboxes, reads each one's status, and reconciles the registry
// with them (see reconcile): known is how many the runtime has, added how many the registry
// did not know (adopted), dropped how many it knew that the runtime no longer has. One attempt,
// bounded in time; the caller retries.
func (reg *Registry) Rebuild(ctx context.Context, rt runtimeapi.RuntimeServiceClient) (known, added, dropped int, err error) {
	end := reg.beginRebuild()
	defer end()
	sandboxes, live, err := runtimeLists(ctx, rt)
	if err != nil {
		return 0, 0, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, statusBudget+time.Duration(len(sandboxes)+len(live))*perItemBudget)
	defer cancel()
	seen, sbRead := sandboxRecords(ctx, rt, sandboxes)
	containers, ctrRead := containerRecords(ctx, rt, seen, live)
	if !sbRead || !ctrRead {
		// Some statuses were not read: the registry must not take the sandboxes left out for
		// gone. The caller tries again.
		return 0, 0, 0, fmt.Errorf("read the statuses of %d sandboxes and %d containers: %w", len(sandboxes), len(live), cmp.Or(ctx.Err(), context.Canceled))
	}
	added, dropped = reg.reconcile(seen, containers)
	return len(seen), added, dropped, nil
}

// runtimeLists lists the runtime's sandboxes, and its containers that have a cgroup to verify
// (created or running; an exited container's cgroup is gone).
func runtimeLists(ctx context.Context, rt runtimeapi.RuntimeServiceClient) ([]*runtimeapi.PodSandbox, []*runtimeapi.Container, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	sbs, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list sandboxes: %w", err)
	}
	ctrs, err := rt.ListContainers(ctx, &runtimeapi.ListContainersRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list containers: %w", err)
	}
	live := slices.DeleteFunc(ctrs.GetContainers(), func(c *runtimeapi.Container) bool {
		s := c.GetState()
		return s != runtimeapi.ContainerState_CONTAINER_RUNNING && s != runtimeapi.ContainerState_CONTAINER_CREATED
	})
	return sbs.GetItems(), live, nil
}

// sandboxRecords reads each sandbox's status, statusWorkers at a time, into adopted records in
// the list's order. A sandbox removed between the list and its status is left out. read is
// false when ctx ended before every status was asked for.
func sandboxRecords(ctx context.Context, rt runtimeapi.RuntimeServiceClient, sbs []*runtimeapi.PodSandbox) (seen []runtimeSandbox, read bool) {
	recs := make([]runtimeSandbox, len(sbs))
	var asked atomic.Int64
	workqueue.ParallelizeUntil(ctx, statusWorkers, len(sbs), func(i int) {
		asked.Add(1)
		recs[i] = recordFromRuntime(ctx, rt, sbs[i])
	})
	seen = make([]runtimeSandbox, 0, len(recs))
	for i := range recs {
		if !recs[i].gone {
			seen = append(seen, recs[i])
		}
	}
	return seen, asked.Load() == int64(len(sbs))
}

// containerRecords reads each live container's runtime spec, statusWorkers at a time, into
// adopted records in the list's order, with what the spec asks. A container removed between
// the list and its status is left out; one whose status could not be read is kept with the
// error (its features read it again later). read is false when ctx ended before every status
// was asked for.
func containerRecords(ctx context.Context, rt runtimeapi.RuntimeServiceClient, sandboxes []runtimeSandbox, live []*runtimeapi.Container) (out []runtimeContainer, read bool) {
	pods := make(map[string]types.UID, len(sandboxes))
	for i := range sandboxes {
		pods[sandboxes[i].ID] = sandboxes[i].Pod.UID
	}
	recs := make([]runtimeContainer, len(live))
	gone := make([]bool, len(live))
	var asked atomic.Int64
	workqueue.ParallelizeUntil(ctx, statusWorkers, len(live), func(i int) {
		asked.Add(1)
		c := live[i]
		rec := runtimeContainer{
			ContainerRecord: ContainerRecord{
				ID: c.GetId(), Name: c.GetMetadata().GetName(), SandboxID: c.GetPodSandboxId(),
				PodUID: cmp.Or(pods[c.GetPodSandboxId()], types.UID(c.GetLabels()[podUIDLabel])),
				Origin: OriginAdopted,
			},
			AdoptedContainer: AdoptedContainer{Created: c.GetState() == runtimeapi.ContainerState_CONTAINER_CREATED},
		}
		spec, err := containerSpec(ctx, rt, c.GetId())
		switch {
		case status.Code(err) == codes.NotFound:
			gone[i] = true // removed meanwhile
		case err != nil:
			rec.Err = err
		default:
			rec.Resources, rec.CgroupsPath = spec.Linux.Resources, spec.Linux.CgroupsPath
		}
		recs[i] = rec
	})
	out = make([]runtimeContainer, 0, len(recs))
	for i := range recs {
		if !gone[i] {
			out = append(out, recs[i])
		}
	}
	return out, asked.Load() == int64(len(live))
}

// podUIDLabel is the label the kubelet puts on every container with its pod's UID.
const podUIDLabel = "io.kubernetes.pod.uid"

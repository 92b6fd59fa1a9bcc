package registry

import (
	"context"
	"fmt"
	"time"

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
	added, dropped = reg.reconcile(seen)
	return len(seen), added, dropped, nil
}

package pipeline_test

import (
	"context"
	"slices"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri"
	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/test/crifake"
)

// resourcesRuntime is a fake runtime that hands the test each UpdateContainerResources it gets.
type resourcesRuntime struct {
	*crifake.Runtime
	got chan *runtimeapi.UpdateContainerResourcesRequest
}

func (r resourcesRuntime) UpdateContainerResources(_ context.Context, req *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	r.got <- req
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

type updateHook = pipeline.Hook[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse]

// hook is a hook of feature that records its before and after in j, and sets the request's CPU
// shares to shares when not 0.
func hook(feature string, readOnly bool, shares int64, j *journal) updateHook {
	return updateHook{Feature: feature, ReadOnly: readOnly, Fn: func(ctx context.Context, req *runtimeapi.UpdateContainerResourcesRequest,
		next cri.Forward[*runtimeapi.UpdateContainerResourcesRequest, *runtimeapi.UpdateContainerResourcesResponse],
	) (*runtimeapi.UpdateContainerResourcesResponse, error) {
		j.add("before %s", feature)
		if shares != 0 {
			req.Linux.CpuShares = shares
		}
		resp, err := next(ctx, req)
		j.add("after %s", feature)
		return resp, err
	}}
}

// TestInterceptHooks: a method's hooks run outermost first; hooks marked ReadOnly are observers
// (cri.Observe): what they change is not sent when all of a method's hooks only read, while a
// hook that may change the request has its change forwarded.
func TestInterceptHooks(t *testing.T) {
	for _, tc := range []struct {
		name       string
		hooks      func(j *journal) []updateHook
		wantShares int64
		want       []string
	}{
		{"read-only", func(j *journal) []updateHook {
			return []updateHook{hook("reads", true, 999, j)} // a read-only hook that breaks its word
		}, 2, []string{"before reads", "after reads"}},
		{"changing", func(j *journal) []updateHook {
			return []updateHook{hook("outer", true, 0, j), hook("changes", false, 1024, j)}
		}, 1024, []string{"before outer", "before changes", "after changes", "after outer"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := resourcesRuntime{Runtime: crifake.NewRuntime(), got: make(chan *runtimeapi.UpdateContainerResourcesRequest, 1)}
			p := crifake.NewProxy(t, rt)
			j := &journal{}
			pipeline.Intercept(p.Server, cri.UpdateContainerResources, tc.hooks(j))
			p.Start(t)
			req := &runtimeapi.UpdateContainerResourcesRequest{ContainerId: "c", Linux: &runtimeapi.LinuxContainerResources{CpuShares: 2}}
			if _, err := p.Client.UpdateContainerResources(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			if got := (<-rt.got).GetLinux().GetCpuShares(); got != tc.wantShares {
				t.Errorf("runtime got cpu shares %d, want %d", got, tc.wantShares)
			}
			if got := j.take(); !slices.Equal(got, tc.want) {
				t.Errorf("hooks did %q, want %q", got, tc.want)
			}
		})
	}
}

package podresources

import (
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// fakePulls is a PullLister of one pull per pod it is asked about; it records what it was
// asked.
type fakePulls struct {
	mu    sync.Mutex
	asked [][2]string
}

var _ PullLister = (*fakePulls)(nil)

func (f *fakePulls) Pulls(namespace, name string) []*pb.ImagePull {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, [2]string{namespace, name})
	return []*pb.ImagePull{{PodNamespace: namespace, PodName: name, Image: "example.com/app:v1"}}
}

// TestPodPulls: PodPulls lists every pod's pulls, or the named pod's; a pod half named (a
// namespace without a name) is InvalidArgument and never asked about; without a PullLister it
// lists none.
func TestPodPulls(t *testing.T) {
	pulls := &fakePulls{}
	r := newRig(t, Options{Source: webSource(), Pulls: pulls})
	ctx := testContext(t)
	for _, req := range []*pb.PodPullsRequest{{}, {PodNamespace: "default", PodName: "web"}} {
		resp, err := r.ext().PodPulls(ctx, req)
		if err != nil || len(resp.GetPulls()) != 1 || resp.GetPulls()[0].GetPodName() != req.GetPodName() {
			t.Errorf("PodPulls(%v) = %v, %v; want the lister's pulls of that pod", req, resp, err)
		}
	}
	for _, req := range []*pb.PodPullsRequest{{PodNamespace: "default"}, {PodName: "web"}, {PodNamespace: "Default", PodName: "web"}} {
		if _, err := r.ext().PodPulls(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("PodPulls(%v): %v, want InvalidArgument", req, err)
		}
	}
	pulls.mu.Lock()
	if want := [][2]string{{"", ""}, {"default", "web"}}; len(pulls.asked) != 2 || pulls.asked[0] != want[0] || pulls.asked[1] != want[1] {
		t.Errorf("the lister was asked %v, want %v", pulls.asked, want)
	}
	pulls.mu.Unlock()

	none := newRig(t, Options{Source: webSource()})
	if resp, err := none.ext().PodPulls(ctx, &pb.PodPullsRequest{}); err != nil || len(resp.GetPulls()) != 0 {
		t.Errorf("PodPulls without a lister = %v, %v; want none", resp, err)
	}
}

package imagepull

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// BenchmarkSchedulingOverhead is the governor's cost per pull: an instant backend called
// directly (path=direct) vs. through the governor (path=governor) with caps set, so every pull
// takes a slot, runs, frees it and wakes the queue. Distinct images keep de-duplication out of
// it. The difference of the two is the scheduling overhead per pull.
func BenchmarkSchedulingOverhead(b *testing.B) {
	pulls := make([]Pull, 1024)
	for i := range pulls {
		p, err := NewPull(&runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: fmt.Sprintf("registry.example.com/app%d:v1", i)}})
		if err != nil {
			b.Fatal(err)
		}
		pulls[i] = p
	}
	resp := &runtimeapi.PullImageResponse{ImageRef: "sha256:x"}
	instant := func(context.Context) (*runtimeapi.PullImageResponse, error) { return resp, nil }
	for _, parallel := range []bool{false, true} {
		mode := "serial"
		if parallel {
			mode = "parallel"
		}
		b.Run("callers="+mode+"/path=direct", func(b *testing.B) {
			run(b, parallel, func(ctx context.Context, i int) error {
				_, err := instant(ctx)
				return err
			})
		})
		b.Run("callers="+mode+"/path=governor", func(b *testing.B) {
			g := New(Limits{MaxParallel: 3, PerRegistry: map[string]int{"registry.example.com": 2}})
			run(b, parallel, func(ctx context.Context, i int) error {
				_, err := g.Do(ctx, pulls[i%len(pulls)], instant)
				return err
			})
		})
	}
}

func run(b *testing.B, parallel bool, call func(context.Context, int) error) {
	// Logs are discarded: the benchmark measures scheduling, not the log sink (klog's text
	// output to stderr adds about 5-10µs per logged line).
	ctx := klog.NewContext(b.Context(), logr.Discard())
	if !parallel {
		for i := 0; b.Loop(); i++ {
			if err := call(ctx, i); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if err := call(ctx, i); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

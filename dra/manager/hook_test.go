package manager_test

// Drivers that act when the sandbox starts (dra.sandboxHookDrivers): a sandbox of a pod with
// their claims is refused unless each answers, whoever prepared the claims.

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/podgate/podgate/dra/dratest/rig"
	"github.com/podgate/podgate/dra/manager"
)

func TestDRASandboxHookDriverMustAnswer(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode manager.Prepare
		// first runs a sandbox before the driver dies (it prepares the claim when podgate
		// prepares); the sandbox after the death is the one checked.
		first bool
		hook  bool
		// refused: the sandbox after the driver's death is refused.
		refused bool
	}{
		// podgate prepared the claim for the pod's first sandbox; the kubelet re-creates it
		// once the driver is gone, and the claim, prepared, is not asked again.
		{name: "podgate prepared, hook driver", mode: manager.PrepareAlways, first: true, hook: true, refused: true},
		{name: "podgate prepared, other driver", mode: manager.PrepareAlways, first: true},
		// The kubelet prepares: podgate calls no driver at all.
		{name: "kubelet prepared, hook driver", mode: manager.PrepareNever, hook: true, refused: true},
		{name: "kubelet prepared, other driver", mode: manager.PrepareNever},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := rig.Pod("1", "net")
			dr := newRigWith(t, 5*time.Second, func(*rig.Rig) []manager.Option {
				opts := []manager.Option{manager.WithPrepare(tc.mode)}
				if tc.hook {
					opts = append(opts, manager.WithSandboxHookDrivers(rig.Driver))
				}
				return opts
			}, pod, rig.Claim("net", pod))
			if tc.first {
				id, err := dr.RunPod(t, pod)
				if err != nil {
					t.Fatalf("first sandbox, the driver answering: %v", err)
				}
				dr.RemoveSandbox(t, id)
			}
			// The driver's DRA service dies; its registration stays, as a killed driver's
			// socket does.
			dr.Driver.StopDRA()
			if _, err := dr.Drivers.Lookup(rig.Driver); err != nil {
				t.Fatalf("driver not registered any more: %v", err)
			}
			calls := len(dr.Driver.Calls())
			_, err := dr.RunPod(t, pod)
			if !tc.refused {
				// What dra.sandboxHookDrivers is for: without it, the sandbox goes on.
				if err != nil {
					t.Fatalf("RunPodSandbox: %v, want it forwarded", err)
				}
				return
			}
			st := status.Convert(err)
			if st.Code() != codes.Unavailable {
				t.Fatalf("RunPodSandbox: %v, want Unavailable", err)
			}
			for _, s := range []string{"default/pod-1", "default/net", rig.Driver, "does not answer"} {
				if !strings.Contains(st.Message(), s) {
					t.Errorf("error %q does not say %q", st.Message(), s)
				}
			}
			if n := len(dr.RuntimeSandboxes(t)); n != 0 {
				t.Errorf("runtime holds %d sandboxes, want none", n)
			}
			if got := dr.Driver.Calls(); len(got) != calls {
				t.Errorf("driver calls %v after the refusal, want none new", got[calls:])
			}
		})
	}
}

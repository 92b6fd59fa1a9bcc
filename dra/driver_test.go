package dra_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/dra/dratest"
)

const driverName = "net.example.com"

var (
	claimA = dra.Claim{Namespace: "default", Name: "nic-a", UID: "uid-a"}
	claimB = dra.Claim{Namespace: "team", Name: "nic-b", UID: "uid-b"}
)

// Full method names, to tell which service a call used.
const (
	v1Prepare        = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
	v1Unprepare      = "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources"
	v1beta1Prepare   = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources"
	v1beta1Unprepare = "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources"
)

// wantDevice is what the fake driver prepares for c, as podgate reports it.
func wantDevice(c dra.Claim) dra.Device {
	d := dratest.Device(c.Name)
	return dra.Device{Requests: d.GetRequestNames(), Pool: d.GetPoolName(), Name: d.GetDeviceName(), CDIDeviceIDs: d.GetCdiDeviceIds()}
}

// holdCalls makes every later call of td wait until its caller leaves; the channel learns of
// each held call.
func holdCalls(td *dratest.Driver) <-chan struct{} {
	entered := make(chan struct{}, 16)
	td.SetHook(func(ctx context.Context, _ string) error {
		select {
		case entered <- struct{}{}:
		case <-ctx.Done():
		}
		<-ctx.Done()
		return ctx.Err()
	})
	return entered
}

func sameDevices(a, b []dra.Device) bool {
	return slices.EqualFunc(a, b, func(x, y dra.Device) bool {
		return slices.Equal(x.Requests, y.Requests) && x.Pool == y.Pool && x.Name == y.Name &&
			slices.Equal(x.CDIDeviceIDs, y.CDIDeviceIDs) && x.ShareID == y.ShareID
	})
}

func TestPrepareUnprepare(t *testing.T) {
	tests := []struct {
		name        string
		serve       []string
		advertise   []string
		wantService string
		wantMethods []string
	}{
		{
			name:        "v1",
			serve:       []string{drapbv1.DRAPluginService},
			wantService: drapbv1.DRAPluginService,
			wantMethods: []string{v1Prepare, v1Unprepare},
		},
		{
			name:        "v1beta1 only: fallback",
			serve:       []string{drapbv1beta1.DRAPluginService},
			wantService: drapbv1beta1.DRAPluginService,
			wantMethods: []string{v1beta1Prepare, v1beta1Unprepare},
		},
		{
			name:        "both: v1 preferred, whatever the order advertised",
			serve:       []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService},
			advertise:   []string{drapbv1beta1.DRAPluginService, "v1.DRAResourceHealth", drapbv1.DRAPluginService},
			wantService: drapbv1.DRAPluginService,
			wantMethods: []string{v1Prepare, v1Unprepare},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			opts := []dratest.Option{dratest.WithServices(tt.serve...)}
			if tt.advertise != nil {
				opts = append(opts, dratest.WithVersions(tt.advertise...))
			}
			td := startDriver(t, n, driverName, opts...)
			d := startDiscovery(t, n)
			drv := d.waitFor(t, driverName)
			if drv.Service() != tt.wantService {
				t.Errorf("Service() = %q, want %q", drv.Service(), tt.wantService)
			}
			ctx := context.Background()

			results, err := drv.Prepare(ctx, []dra.Claim{claimA, claimB})
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if len(results) != 2 {
				t.Errorf("Prepare returned %d results, want 2", len(results))
			}
			for _, c := range []dra.Claim{claimA, claimB} {
				r := results[c.UID]
				if r.Err != nil || !sameDevices(r.Devices, []dra.Device{wantDevice(c)}) {
					t.Errorf("claim %s: %+v, want %+v", c, r, wantDevice(c))
				}
			}

			unprepared, err := drv.Unprepare(ctx, []dra.Claim{claimA, claimB})
			if err != nil {
				t.Fatalf("Unprepare: %v", err)
			}
			for _, c := range []dra.Claim{claimA, claimB} {
				if e, ok := unprepared[c.UID]; !ok || e != nil {
					t.Errorf("claim %s: unprepare result %v (present %v), want nil", c, e, ok)
				}
			}
			if got := td.Methods(); !slices.Equal(got, tt.wantMethods) {
				t.Errorf("driver served %q, want %q", got, tt.wantMethods)
			}
			for _, op := range []string{"prepare", "unprepare"} {
				labels := map[string]string{"driver": driverName, "operation": op, "result": "success"}
				if v, _ := d.metric(t, "podgate_dra_operations_total", labels); v != 1 {
					t.Errorf("podgate_dra_operations_total%v = %v, want 1", labels, v)
				}
				if v, _ := d.metric(t, "podgate_dra_operation_duration_seconds", map[string]string{"driver": driverName, "operation": op}); v != 1 {
					t.Errorf("podgate_dra_operation_duration_seconds{%s} has %v samples, want 1", op, v)
				}
			}
		})
	}
}

// TestPrepareRepeated: a repeated prepare (the kubelet's retry, podgate's restart) goes to the
// driver again, which is idempotent, and gets the same devices.
func TestPrepareRepeated(t *testing.T) {
	n := newNode(t)
	td := startDriver(t, n, driverName)
	drv := startDiscovery(t, n).waitFor(t, driverName)
	var first map[types.UID]dra.PrepareResult
	for i := range 3 {
		results, err := drv.Prepare(context.Background(), []dra.Claim{claimA})
		if err != nil {
			t.Fatalf("Prepare #%d: %v", i+1, err)
		}
		if first == nil {
			first = results
		} else if !sameDevices(results[claimA.UID].Devices, first[claimA.UID].Devices) {
			t.Errorf("Prepare #%d: devices %+v, first time %+v", i+1, results[claimA.UID].Devices, first[claimA.UID].Devices)
		}
	}
	if got, want := td.Calls(), slices.Repeat([]string{"prepare default/nic-a"}, 3); !slices.Equal(got, want) {
		t.Errorf("the driver got %q, want %q (passed through, not cached)", got, want)
	}
}

// TestClaimErrors: the driver answers, failing one claim or leaving it out. The other claim's
// result stands; the error names the failed claim and the driver, of class Unavailable.
func TestClaimErrors(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(d *dratest.Driver)
		wantMsg string
	}{
		{name: "driver fails the claim", setup: func(d *dratest.Driver) {
			d.FailClaim(claimB.Namespace, claimB.Name, "no free VF on eth0")
			d.FailUnprepare(claimB.Namespace, claimB.Name, "no free VF on eth0")
		}, wantMsg: "no free VF on eth0"},
		{name: "driver leaves the claim out", setup: func(d *dratest.Driver) { d.OmitClaim(claimB.Namespace, claimB.Name) }, wantMsg: "no answer for the claim"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			td := startDriver(t, n, driverName)
			tt.setup(td)
			d := startDiscovery(t, n)
			drv := d.waitFor(t, driverName)
			ctx := context.Background()

			results, err := drv.Prepare(ctx, []dra.Claim{claimA, claimB})
			checkClaimError(t, "Prepare", err, results[claimB.UID].Err, "prepare", tt.wantMsg)
			if r := results[claimA.UID]; r.Err != nil || !sameDevices(r.Devices, []dra.Device{wantDevice(claimA)}) {
				t.Errorf("claim %s: %+v, want prepared", claimA, r)
			}
			labels := map[string]string{"driver": driverName, "operation": "prepare", "result": "claim_error"}
			if v, _ := d.metric(t, "podgate_dra_operations_total", labels); v != 1 {
				t.Errorf("podgate_dra_operations_total%v = %v, want 1", labels, v)
			}

			unprepared, err := drv.Unprepare(ctx, []dra.Claim{claimA, claimB})
			checkClaimError(t, "Unprepare", err, unprepared[claimB.UID], "unprepare", tt.wantMsg)
			if e, ok := unprepared[claimA.UID]; !ok || e != nil {
				t.Errorf("claim %s: unprepare result %v (present %v), want nil", claimA, e, ok)
			}
		})
	}
}

func checkClaimError(t *testing.T, call string, err, claimErr error, op, wantMsg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: nil error, want claim %s's", call, claimB)
	}
	var derr *dra.Error
	if !errors.As(err, &derr) || derr.Claim == nil || *derr.Claim != claimB || derr.Driver != driverName || derr.Operation != op {
		t.Errorf("%s: %#v, want a *dra.Error for claim %s of driver %s", call, err, claimB, driverName)
	}
	if !errors.Is(errdefs.Resolve(err), errdefs.ErrUnavailable) {
		t.Errorf("%s: class %v, want Unavailable", call, errdefs.Resolve(err))
	}
	for _, want := range []string{op + " claim team/nic-b", "uid-b", driverName, wantMsg} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %q does not say %q", call, err, want)
		}
	}
	if claimErr == nil || claimErr.Error() != err.Error() {
		t.Errorf("%s: the claim's own error is %v, want %v", call, claimErr, err)
	}
	noStatus(t, err)
}

// noStatus checks that err carries no gRPC status the CRI boundary would pass through instead
// of mapping the class.
func noStatus(t *testing.T, err error) {
	t.Helper()
	if _, ok := status.FromError(err); ok {
		t.Errorf("%v carries a gRPC status", err)
	}
}

// TestCallFailures: the call as a whole fails. The error names the claims and the driver; its
// class is Unavailable, or the caller's context error when the caller gave up.
func TestCallFailures(t *testing.T) {
	const timeout = 300 * time.Millisecond
	tests := []struct {
		name string
		// setup breaks the driver; ctx, if returned, is the caller's context.
		setup      func(t *testing.T, d *discovery, td *dratest.Driver) context.Context
		wantClass  error
		wantResult string
		wantMsg    string
		// maxDuration bounds the call.
		maxDuration time.Duration
	}{
		{
			name:       "driver down",
			setup:      func(t *testing.T, d *discovery, td *dratest.Driver) context.Context { td.StopDRA(); return nil },
			wantClass:  errdefs.ErrUnavailable,
			wantResult: "error",
			wantMsg:    "code Unavailable",
		},
		{
			name: "driver fails the call",
			setup: func(t *testing.T, d *discovery, td *dratest.Driver) context.Context {
				td.SetHook(func(context.Context, string) error { return status.Error(codes.Internal, "driver state corrupt") })
				return nil
			},
			wantClass:  errdefs.ErrUnavailable,
			wantResult: "error",
			wantMsg:    "driver state corrupt (code Internal)",
		},
		{
			name:        "driver too slow",
			setup:       func(t *testing.T, d *discovery, td *dratest.Driver) context.Context { holdCalls(td); return nil },
			wantClass:   errdefs.ErrUnavailable,
			wantResult:  "timeout",
			wantMsg:     "timed out (call timeout " + timeout.String() + ")",
			maxDuration: timeout + 5*time.Second,
		},
		{
			name: "caller gives up",
			setup: func(t *testing.T, d *discovery, td *dratest.Driver) context.Context {
				entered := holdCalls(td)
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					select {
					case <-entered:
						cancel()
					case <-ctx.Done():
					}
				}()
				t.Cleanup(cancel)
				return ctx
			},
			wantClass:  context.Canceled,
			wantResult: "canceled",
			wantMsg:    "caller gave up",
		},
		{
			name: "driver forgotten meanwhile",
			setup: func(t *testing.T, d *discovery, td *dratest.Driver) context.Context {
				td.StopRegistration()
				d.waitUntil(t, "forgotten", func() bool { _, ok := d.Get(driverName); return !ok })
				return nil
			},
			wantClass:  errdefs.ErrUnavailable,
			wantResult: "error",
			wantMsg:    "the driver left the plugin registry",
		},
	}
	for _, tt := range tests {
		for _, op := range []string{"prepare", "unprepare"} {
			t.Run(tt.name+"/"+op, func(t *testing.T) {
				n := newNode(t)
				td := startDriver(t, n, driverName)
				d := startDiscovery(t, n, dra.WithCallTimeout(timeout))
				drv := d.waitFor(t, driverName)
				ctx := tt.setup(t, d, td)
				if ctx == nil {
					ctx = context.Background()
				}

				start := time.Now()
				var err error
				if op == "prepare" {
					var results map[types.UID]dra.PrepareResult
					results, err = drv.Prepare(ctx, []dra.Claim{claimA, claimB})
					if results != nil {
						t.Errorf("results %v from a failed call", results)
					}
				} else {
					var results map[types.UID]error
					results, err = drv.Unprepare(ctx, []dra.Claim{claimA, claimB})
					if results != nil {
						t.Errorf("results %v from a failed call", results)
					}
				}
				elapsed := time.Since(start)

				if err == nil {
					t.Fatal("nil error")
				}
				var derr *dra.Error
				if !errors.As(err, &derr) || derr.Driver != driverName || derr.Claim != nil || derr.Operation != op {
					t.Errorf("%#v, want a *dra.Error for the whole call of driver %s", err, driverName)
				}
				if got := errdefs.Resolve(err); !errors.Is(got, tt.wantClass) {
					t.Errorf("class %v, want %v", got, tt.wantClass)
				}
				for _, want := range []string{op + " claims default/nic-a, team/nic-b", "DRA driver " + driverName, tt.wantMsg} {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("%q does not say %q", err, want)
					}
				}
				noStatus(t, err)
				if tt.maxDuration > 0 && (elapsed < timeout || elapsed > tt.maxDuration) {
					t.Errorf("the call took %s, want between %s and %s", elapsed, timeout, tt.maxDuration)
				}
				labels := map[string]string{"driver": driverName, "operation": op, "result": tt.wantResult}
				if v, _ := d.metric(t, "podgate_dra_operations_total", labels); v != 1 {
					t.Errorf("podgate_dra_operations_total%v = %v, want 1", labels, v)
				}
			})
		}
	}
}

func TestBadClaims(t *testing.T) {
	n := newNode(t)
	td := startDriver(t, n, driverName)
	drv := startDiscovery(t, n).waitFor(t, driverName)
	ctx := context.Background()

	if r, err := drv.Prepare(ctx, nil); err != nil || len(r) != 0 {
		t.Errorf("Prepare(no claims) = %v, %v; want empty, nil", r, err)
	}
	if r, err := drv.Unprepare(ctx, nil); err != nil || len(r) != 0 {
		t.Errorf("Unprepare(no claims) = %v, %v; want empty, nil", r, err)
	}
	noUID := dra.Claim{Namespace: "default", Name: "x"}
	if _, err := drv.Prepare(ctx, []dra.Claim{claimA, noUID}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Prepare(claim without UID) = %v, want InvalidArgument", err)
	}
	if _, err := drv.Unprepare(ctx, []dra.Claim{noUID}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("Unprepare(claim without UID) = %v, want InvalidArgument", err)
	}
	if got := td.Methods(); len(got) != 0 {
		t.Errorf("the driver was called: %q", got)
	}
}

package podresources

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

func TestNewServerOptions(t *testing.T) {
	tests := []struct {
		name    string
		o       Options
		wantErr string
	}{
		{"no source", Options{}, "no source"},
		{"negative QPS", Options{Source: &fakeSource{}, QPS: -1}, "qps"},
		{"negative burst", Options{Source: &fakeSource{}, Burst: -1}, "burst"},
		{"defaults", Options{Source: &fakeSource{}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewServer(tt.o)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("NewServer: %v", err)
			case tt.wantErr == "":
				if s == nil {
					t.Fatal("NewServer returned no server and no error")
				}
			case err == nil || !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("NewServer: %v, want an error saying %q", err, tt.wantErr)
			}
		})
	}
}

// TestRateLimit: with QPS 1 and burst 2 the third immediate call is refused, whichever service
// it calls, and the health check is never limited.
func TestRateLimit(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t, Options{Source: webSource(), QPS: 1, Burst: 2})
	for i := range 2 {
		if _, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{}); err != nil {
			t.Fatalf("call %d, within the burst: %v", i+1, err)
		}
	}
	// The bucket refills one token a second; these calls follow within milliseconds.
	_, err := r.v1().List(ctx, &v1.ListPodResourcesRequest{})
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "podResources.qps") {
		t.Fatalf("third call: %v, want ResourceExhausted naming podResources.qps", err)
	}
	if _, err := r.ext().Get(ctx, &pb.GetRequest{PodNamespace: "shop", PodName: "web"}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("extension Get over the limit: %v, want ResourceExhausted", err)
	}
	watch, err := r.ext().Watch(ctx, &pb.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := watch.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Watch over the limit: %v, want ResourceExhausted", err)
	}
	health := healthpb.NewHealthClient(r.conn)
	for i := range 5 {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health check %d with the bucket empty: %v, %v; want SERVING", i+1, resp, err)
		}
	}
	for _, tc := range []struct {
		method, code string
		want         float64
	}{
		{"/v1.PodResourcesLister/List", "OK", 2},
		{"/v1.PodResourcesLister/List", "ResourceExhausted", 1},
		{"/podgate.podresources.v1alpha1.PodResources/Get", "ResourceExhausted", 1},
		{"/podgate.podresources.v1alpha1.PodResources/Watch", "ResourceExhausted", 1},
	} {
		if got := metricValue(t, r.metrics, "podgate_podresources_requests_total", "method", tc.method, "code", tc.code); got != tc.want {
			t.Errorf("requests_total{%s,%s} = %v, want %v", tc.method, tc.code, got, tc.want)
		}
	}
}

// TestReflection: grpcurl's view of the socket lists both services and health, and can
// describe both services.
func TestReflection(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t, Options{Source: webSource()})
	stream, err := reflectionpb.NewServerReflectionClient(r.conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		t.Helper()
		if err := stream.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("reflection %v: %v", req, e)
		}
		return resp
	}
	var services []string
	for _, s := range ask(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}).GetListServicesResponse().GetService() {
		services = append(services, s.GetName())
	}
	for _, want := range []string{"v1.PodResourcesLister", "podgate.podresources.v1alpha1.PodResources", "grpc.health.v1.Health"} {
		if !slices.Contains(services, want) {
			t.Errorf("ListServices = %v, missing %s", services, want)
		}
		resp := ask(&reflectionpb.ServerReflectionRequest{
			MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: want},
		})
		if len(resp.GetFileDescriptorResponse().GetFileDescriptorProto()) == 0 {
			t.Errorf("reflection has no descriptor for %s", want)
		}
	}
	if err := stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
}

// TestHealthAndShutdown: every service is SERVING; Shutdown reports NOT_SERVING to a health
// watcher, Serve returns nil, and the socket then refuses calls.
func TestHealthAndShutdown(t *testing.T) {
	ctx := testContext(t)
	r := newRig(t, Options{Source: webSource()})
	health := healthpb.NewHealthClient(r.conn)
	for _, service := range []string{"", "v1.PodResourcesLister", "podgate.podresources.v1alpha1.PodResources"} {
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health of %q: %v, %v; want SERVING", service, resp, err)
		}
	}

	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watch, err := health.Watch(watchCtx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health watch: %v, %v; want SERVING", resp, err)
	}

	done := make(chan struct{})
	go func() {
		defer close(done)
		r.shutdown(t) // checks that Serve returns nil
	}()
	// The health watch is a call in flight: Shutdown waits for it, and tells it first.
	if resp, err := watch.Recv(); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health watch during Shutdown: %v, %v; want NOT_SERVING", resp, err)
	}
	stopWatch()
	<-done

	if resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("health check after Shutdown: %v, %v; want Unavailable", resp, err)
	}
}

// TestExtensionListAndGet: the extension lists every pod podgate knows, two of one name
// included, by namespace, name and UID; Get returns the pod the source names.
func TestExtensionListAndGet(t *testing.T) {
	ctx := testContext(t)
	src := &fakeSource{}
	older := pod("b", "dup", "uid-2", sandbox(t0))
	newer := pod("b", "dup", "uid-1", sandbox(t0.Add(time.Minute)), netClaim())
	src.set(3, pod("c", "a", "uid-5", nil), older, pod("a", "z", "uid-9", sandbox(t0)), newer, pod("b", "a", "uid-7", nil))
	r := newRig(t, Options{Source: src})

	list, err := r.ext().List(ctx, &pb.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range list.GetPods() {
		got = append(got, p.GetNamespace()+"/"+p.GetName()+"/"+p.GetUid())
	}
	if want := []string{"a/z/uid-9", "b/a/uid-7", "b/dup/uid-1", "b/dup/uid-2", "c/a/uid-5"}; !slices.Equal(got, want) {
		t.Errorf("List = %v, want %v", got, want)
	}
	if !proto.Equal(list.GetPods()[2], newer) {
		t.Errorf("List changed a pod: %s", prototext.Format(list.GetPods()[2]))
	}

	resp, err := r.ext().Get(ctx, &pb.GetRequest{PodNamespace: "b", PodName: "dup"})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(resp.GetPod(), newer) {
		t.Errorf("Get b/dup = %s, want the newer pod %s", prototext.Format(resp.GetPod()), prototext.Format(newer))
	}
}

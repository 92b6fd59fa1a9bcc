package podresources

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// getters calls Get of each service with a pod's namespace and name.
func getters(r *rig) map[string]func(ctx context.Context, namespace, name string) error {
	return map[string]func(ctx context.Context, namespace, name string) error{
		"v1": func(ctx context.Context, namespace, name string) error {
			_, err := r.v1().Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: namespace, PodName: name})
			return err
		},
		"v1alpha1": func(ctx context.Context, namespace, name string) error {
			_, err := r.ext().Get(ctx, &pb.GetRequest{PodNamespace: namespace, PodName: name})
			return err
		},
	}
}

// maxErrorMessage bounds what an error may say back about a client's value.
const maxErrorMessage = 1024

func TestGetChecksRequest(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name            string
		namespace, pod  string
		code            codes.Code
		field           string // InvalidArgument: the field the message starts with
		messageContains string
	}{
		{name: "unknown pod", namespace: "shop", pod: "nobody", code: codes.NotFound, messageContains: "shop/nobody"},
		{name: "longest valid name, unknown", namespace: long(63), pod: long(253), code: codes.NotFound},
		{name: "empty name", namespace: "shop", pod: "", code: codes.InvalidArgument, field: "pod_name"},
		{name: "empty namespace", namespace: "", pod: "web", code: codes.InvalidArgument, field: "pod_namespace"},
		{name: "invalid name", namespace: "shop", pod: "Web_1", code: codes.InvalidArgument, field: "pod_name"},
		{name: "invalid namespace", namespace: "Shop", pod: "web", code: codes.InvalidArgument, field: "pod_namespace"},
		{name: "namespace with a dot", namespace: "shop.prod", pod: "web", code: codes.InvalidArgument, field: "pod_namespace"},
		{name: "300-byte name", namespace: "shop", pod: long(300), code: codes.InvalidArgument, field: "pod_name"},
		{name: "300-byte namespace", namespace: long(300), pod: "web", code: codes.InvalidArgument, field: "pod_namespace"},
		{name: "64-byte namespace", namespace: long(64), pod: "web", code: codes.InvalidArgument, field: "pod_namespace"},
		{name: "60 KiB name, under the request limit", namespace: "shop", pod: long(60 << 10), code: codes.InvalidArgument, field: "pod_name"},
		{name: "60 KiB namespace of quoted bytes", namespace: strings.Repeat("\x00", 60<<10), pod: "web", code: codes.InvalidArgument, field: "pod_namespace"},
		{name: "100 KiB name, over the 64 KiB request limit", namespace: "shop", pod: long(100 << 10), code: codes.ResourceExhausted},
	}
	// One server for the whole table: the table's calls stay within the default burst only with
	// a raised limit.
	r := newRig(t, Options{Source: webSource(), QPS: 1e6, Burst: 1e6})
	for _, tt := range tests {
		for service, get := range getters(r) {
			t.Run(tt.name+"/"+service, func(t *testing.T) {
				err := get(testContext(t), tt.namespace, tt.pod)
				st := status.Convert(err)
				if st.Code() != tt.code {
					t.Fatalf("Get: %v, want %v", err, tt.code)
				}
				if len(st.Message()) > maxErrorMessage {
					t.Errorf("the message is %d bytes long, want at most %d: %.200q…", len(st.Message()), maxErrorMessage, st.Message())
				}
				if tt.field != "" && !strings.HasPrefix(st.Message(), tt.field+":") {
					t.Errorf("message %q does not start with the field %q", st.Message(), tt.field)
				}
				if !strings.Contains(st.Message(), tt.messageContains) {
					t.Errorf("message %q does not contain %q", st.Message(), tt.messageContains)
				}
			})
		}
	}
}

// TestGetUnknownWithKubelet: NotFound when neither podgate nor the kubelet knows the pod.
func TestGetUnknownWithKubelet(t *testing.T) {
	r := newRigWithKubelet(t, webSource(), &fakeKubelet{pods: []*v1.PodResources{kubeletWeb()}})
	for service, get := range getters(r) {
		t.Run(service, func(t *testing.T) {
			if err := get(testContext(t), "shop", "nobody"); status.Code(err) != codes.NotFound {
				t.Errorf("Get of an unknown pod: %v, want NotFound", err)
			}
		})
	}
}

func TestQuoteShort(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"short", "web", `"web"`},
		{"64 bytes, kept whole", strings.Repeat("x", 64), `"` + strings.Repeat("x", 64) + `"`},
		{"65 bytes, cut", strings.Repeat("x", 65), `"` + strings.Repeat("x", 64) + `"… (65 bytes)`},
		{"control bytes quoted", "a\nb", `"a\nb"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := quoteShort(tt.in); got != tt.want {
				t.Errorf("quoteShort = %s, want %s", got, tt.want)
			}
		})
	}
}

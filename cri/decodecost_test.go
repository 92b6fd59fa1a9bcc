package cri

import (
	"context"
	"fmt"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/cri/relay"
	"github.com/podgate/podgate/test/testfs"
)

type createFwd = Forward[*runtimeapi.CreateContainerRequest, *runtimeapi.CreateContainerResponse]

// fieldNum is the number of the field path (names joined by dots) of md.
func fieldNum(t testing.TB, md protoreflect.MessageDescriptor, path string) []protowire.Number {
	t.Helper()
	var nums []protowire.Number
	for name := range strings.SplitSeq(path, ".") {
		fd := md.Fields().ByName(protoreflect.Name(name))
		if fd == nil {
			t.Fatalf("%s has no field %s", md.FullName(), name)
		}
		nums = append(nums, fd.Number())
		md = fd.Message()
	}
	return nums
}

// nested wraps entries, the encoded occurrences of the last field of nums, in the messages of
// the fields before it.
func nested(nums []protowire.Number, entries []byte) []byte {
	b := entries
	for i := len(nums) - 2; i >= 0; i-- {
		b = protowire.AppendBytes(protowire.AppendTag(nil, nums[i], protowire.BytesType), b)
	}
	return b
}

// repeated is n occurrences of field num, each the message (or string) v.
func repeated(num protowire.Number, n int, v []byte) []byte {
	one := protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	b := make([]byte, 0, n*len(one))
	for range n {
		b = append(b, one...)
	}
	return b
}

// mapOf is n entries of map field num, with distinct keys of at least keyLen bytes and values
// of valueLen bytes.
func mapOf(num protowire.Number, n, keyLen, valueLen int) []byte {
	var b []byte
	value := strings.Repeat("v", valueLen)
	for i := range n {
		k := fmt.Sprintf("%0*d", keyLen, i)
		b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), mapEntry(k, value))
	}
	return b
}

// createMap is a CreateContainerRequest whose map at path has n entries (mapOf).
func createMap(t testing.TB, path string, n, keyLen, valueLen int) []byte {
	nums := fieldNum(t, (&runtimeapi.CreateContainerRequest{}).ProtoReflect().Descriptor(), path)
	return nested(nums, mapOf(nums[len(nums)-1], n, keyLen, valueLen))
}

// createWith is a CreateContainerRequest whose list at path has n entries, each v.
func createWith(t testing.TB, path string, n int, v []byte) []byte {
	nums := fieldNum(t, (&runtimeapi.CreateContainerRequest{}).ProtoReflect().Descriptor(), path)
	return nested(nums, repeated(nums[len(nums)-1], n, v))
}

// mapEntry is a map<string,string> entry.
func mapEntry(k, v string) []byte {
	b := protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), k)
	return protowire.AppendString(protowire.AppendTag(b, 2, protowire.BytesType), v)
}

func keyValue(k, v string) []byte { return mapEntry(k, v) } // KeyValue: key 1, value 2

// TestDecodeCostBoundsAllocations: for requests of several shapes, what the pre-scan says
// decoding will allocate is at least what proto.Unmarshal allocates (runtime.MemStats'
// TotalAlloc, garbage included), and within 3× of it for the large ones.
func TestDecodeCostBoundsAllocations(t *testing.T) {
	mount := (&runtimeapi.Mount{ContainerPath: "/var/lib/data/volume", HostPath: "/var/lib/kubelet/pods/0d3e2c1b-8f00-4a11-9c52-2b7a3f1e9d01/volumes/kubernetes.io~empty-dir/data", Propagation: runtimeapi.MountPropagation_PROPAGATION_PRIVATE})
	mountBytes, err := proto.Marshal(mount)
	if err != nil {
		t.Fatal(err)
	}
	groups := func(n int) []byte {
		nums := fieldNum(t, (&runtimeapi.CreateContainerRequest{}).ProtoReflect().Descriptor(), "config.linux.security_context.supplemental_groups")
		var packed []byte
		for i := range n {
			packed = protowire.AppendVarint(packed, uint64(100000+i))
		}
		return nested(nums, protowire.AppendBytes(protowire.AppendTag(nil, nums[len(nums)-1], protowire.BytesType), packed))
	}
	unknown := func(n int) []byte {
		var b []byte
		for range n {
			b = protowire.AppendVarint(protowire.AppendTag(b, 999, protowire.VarintType), 1)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		msg  []byte
	}{
		{"200,000 empty envs", createWith(t, "config.envs", 200000, nil)},
		{"50,000 envs of 20 + 100 bytes", createWith(t, "config.envs", 50000, keyValue(strings.Repeat("K", 20), strings.Repeat("v", 100)))},
		{"20,000 mounts", createWith(t, "config.mounts", 20000, mountBytes)},
		{"100,000 annotations of 6 + 0 bytes", createMap(t, "config.annotations", 100000, 6, 0)},
		{"50,000 labels of 30 + 30 bytes", createMap(t, "sandbox_config.labels", 50000, 30, 30)},
		{"3 labels of 10 + 10 bytes", createMap(t, "sandbox_config.labels", 3, 10, 10)},
		{"one 4 MiB argument", createWith(t, "config.args", 1, []byte(strings.Repeat("a", 4<<20)))},
		{"65,536 supplemental groups", groups(65536)},
		{"200,000 unknown fields", unknown(200000)},
		{"a kubelet's request", kubeletCreate(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := newDecodePlan((&runtimeapi.CreateContainerRequest{}).ProtoReflect().Descriptor())
			est, err := plan.decodeCost("CreateContainer", tc.msg)
			if err != nil {
				t.Fatal(err)
			}
			got := decodeAllocs(t, tc.msg)
			t.Logf("%d bytes on the wire: estimate %d, allocated %d (%.2f×), %.1f× the wire", len(tc.msg), est, got, float64(est)/float64(got), float64(got)/float64(len(tc.msg)))
			if est < got {
				t.Errorf("estimate %d bytes, below the %d proto.Unmarshal allocated", est, got)
			}
			if got > 1<<20 && est > 3*got {
				t.Errorf("estimate %d bytes, over 3× the %d proto.Unmarshal allocated", est, got)
			}
		})
	}
}

// kubeletCreate is a CreateContainerRequest as a kubelet sends one.
func kubeletCreate(t testing.TB) []byte {
	req := &runtimeapi.CreateContainerRequest{
		PodSandboxId: strings.Repeat("f", 64),
		Config: &runtimeapi.ContainerConfig{
			Metadata:    &runtimeapi.ContainerMetadata{Name: "web"},
			Image:       &runtimeapi.ImageSpec{Image: "docker.io/library/nginx:1.27"},
			Command:     []string{"nginx"},
			Args:        []string{"-g", "daemon off;"},
			Envs:        []*runtimeapi.KeyValue{{Key: "KUBERNETES_SERVICE_HOST", Value: []byte("10.96.0.1")}, {Key: "KUBERNETES_SERVICE_PORT", Value: []byte("443")}},
			Mounts:      []*runtimeapi.Mount{{ContainerPath: "/etc/hosts", HostPath: "/var/lib/kubelet/pods/u/etc-hosts"}},
			Labels:      map[string]string{"io.kubernetes.container.name": "web", "io.kubernetes.pod.name": "web-0"},
			Annotations: map[string]string{"io.kubernetes.container.hash": "1234abcd", "io.kubernetes.container.restartCount": "0"},
			Linux: &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
				CpuShares: 102, MemoryLimitInBytes: 128 << 20, Unified: map[string]string{"memory.high": "120000000"},
			}},
		},
		SandboxConfig: &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: "web-0", Namespace: "default", Uid: "u"}},
	}
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// decodeAllocs is what proto.Unmarshal allocates to decode msg, the least of three runs (a
// background goroutine's allocations count in TotalAlloc too).
func decodeAllocs(t *testing.T, msg []byte) int64 {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	least := int64(-1)
	var before, after runtime.MemStats
	for range 3 {
		req := new(runtimeapi.CreateContainerRequest)
		runtime.ReadMemStats(&before)
		err := proto.Unmarshal(msg, req)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		runtime.KeepAlive(req)
		n := int64(after.TotalAlloc - before.TotalAlloc)
		if least < 0 || n < least {
			least = n
		}
		runtime.GC()
	}
	return least
}

// TestDecodeRefusesListsNoKubeletSends: a request with more entries in a list or map than any
// kubelet could send is refused InvalidArgument naming the field, before it is decoded: no hook
// runs and nothing reaches the runtime. The same request within the bound is served.
func TestDecodeRefusesListsNoKubeletSends(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	var hooks int
	srv, conn := proxyFor(t, be.path, "", func(s *Server) {
		Intercept(s, CreateContainer, func(ctx context.Context, req *runtimeapi.CreateContainerRequest, next createFwd) (*runtimeapi.CreateContainerResponse, error) {
			hooks++
			return next(ctx, req)
		})
		Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
			hooks++
			return next(ctx, req)
		})
	})
	sandboxWith := func(path string, n int, v []byte) []byte {
		nums := fieldNum(t, (&runtimeapi.RunPodSandboxRequest{}).ProtoReflect().Descriptor(), path)
		return nested(nums, repeated(nums[len(nums)-1], n, v))
	}
	for _, tc := range []struct {
		name, method string
		msg          []byte
		want         string // the status message's end; "" when served
	}{
		{"600,000 empty envs", CreateContainer.FullName(), createWith(t, "config.envs", 600000, nil),
			"decode CreateContainer request: config.envs: 600000 entries, at most 571950"},
		{"300,000 pod annotations", RunPodSandbox.FullName(), sandboxWith("config.annotations", 300000, mapEntry("a", "")),
			"decode RunPodSandbox request: config.annotations: 300000 entries, at most 262144"},
		{"300,000 mounts, in two parts", CreateContainer.FullName(), append(createWith(t, "config.mounts", 150000, nil), createWith(t, "config.mounts", 150000, nil)...),
			"decode CreateContainer request: config.mounts: 300000 entries, at most 262144"},
		{"a truncated request", RunPodSandbox.FullName(), sandboxWith("config.annotations", 1, mapEntry("a", "b"))[:5],
			"decode RunPodSandbox request: unexpected EOF"},
		{"1,000 pod annotations", RunPodSandbox.FullName(), sandboxWith("config.annotations", 1000, mapEntry("a", "")), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hooks = 0
			calls := be.calls.Load()
			var resp frame
			err := conn.Invoke(t.Context(), tc.method, frameOf(tc.msg), &resp, grpc.ForceCodecV2(newRawCodec()))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("a request within the bounds: %v", err)
				}
				return
			}
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.HasSuffix(st.Message(), tc.want) {
				t.Errorf("got %v, want InvalidArgument ending %q", err, tc.want)
			}
			if hooks != 0 || be.calls.Load() != calls {
				t.Errorf("%d hooks ran and %d calls reached the runtime; want none", hooks, be.calls.Load()-calls)
			}
		})
	}
	// The three lists too long, each refused and counted as a client's misbehaviour (the
	// truncated request is malformed, not hostile).
	if n := testutil.ToFloat64(srv.metrics.refusals[relay.ReasonListTooLong]); n != 3 {
		t.Errorf("refusals counted for %s: %v, want 3", relay.ReasonListTooLong, n)
	}
}

// TestDecodeIsChargedAgainstTheBudget: what a request takes decoded counts against the
// connection's budget before it is decoded: a request of 1 MB on the wire whose 100,000 labels
// take some 10 MB decoded is refused ResourceExhausted under a 4 MiB connection budget,
// without reaching a hook or the runtime; one that fits is served; and every byte is given
// back once the calls end.
func TestDecodeIsChargedAgainstTheBudget(t *testing.T) {
	be := newTestRuntime(t, filepath.Join(testfs.ShortDir(t), "rt.sock"))
	var hooks int
	var held int64
	s, conn := proxyFor(t, be.path, "", func(s *Server) {
		s.relay.Limits = relay.Limits{ConnectionBytes: 4 << 20, TotalBytes: 8 << 20}
		Intercept(s, RunPodSandbox, func(ctx context.Context, req *runtimeapi.RunPodSandboxRequest, next runReqFwd) (*runtimeapi.RunPodSandboxResponse, error) {
			hooks++
			held = s.relay.Held()
			return next(ctx, req)
		})
	})
	labels := func(n int) []byte {
		nums := fieldNum(t, (&runtimeapi.RunPodSandboxRequest{}).ProtoReflect().Descriptor(), "config.labels")
		return nested(nums, mapOf(nums[len(nums)-1], n, 6, 0))
	}
	var resp frame
	big := labels(100000)
	err := conn.Invoke(t.Context(), RunPodSandbox.FullName(), frameOf(big), &resp, grpc.ForceCodecV2(newRawCodec()))
	if st := status.Convert(err); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "connection_budget") {
		t.Errorf("%d bytes of 100,000 labels under a 4 MiB budget: %v, want ResourceExhausted (connection_budget)", len(big), err)
	}
	if hooks != 0 || be.calls.Load() != 0 {
		t.Errorf("%d hooks ran and %d calls reached the runtime; want none", hooks, be.calls.Load())
	}
	small := labels(1000)
	if err := conn.Invoke(t.Context(), RunPodSandbox.FullName(), frameOf(small), &resp, grpc.ForceCodecV2(newRawCodec())); err != nil {
		t.Fatalf("%d bytes of 1,000 labels: %v", len(small), err)
	}
	plan := newDecodePlan((&runtimeapi.RunPodSandboxRequest{}).ProtoReflect().Descriptor())
	est, err := plan.decodeCost("RunPodSandbox", small)
	if err != nil {
		t.Fatal(err)
	}
	// The hook saw the request's bytes and the charge for it decoded (twice, and the bytes
	// again: an Intercept keeps a copy to compare, and may encode it anew).
	if want := int64(len(small)) + 2*est + int64(len(small)); held < want {
		t.Errorf("held %d bytes while the hook ran, want at least %d", held, want)
	}
	// The relay gives an answer's bytes back once gRPC has written them, which may be just
	// after the client holds the answer: wait for it, as long as a loaded machine may need.
	gone := func(context.Context) (bool, error) { return s.relay.Held() == 0, nil }
	if err := wait.PollUntilContextTimeout(t.Context(), 5*time.Millisecond, 10*time.Second, true, gone); err != nil {
		t.Errorf("%d bytes still held after the calls ended: %v", s.relay.Held(), err)
	}
}

// FuzzDecodeCost walks arbitrary bytes as the request of every intercepted method: the walk
// never panics, and it refuses nothing that proto.Unmarshal decodes (no fuzzed input is large
// enough to reach a bound on entries).
//
//	go test -run '^$' -fuzz FuzzDecodeCost -fuzztime 60s ./cri
func FuzzDecodeCost(f *testing.F) {
	for _, seed := range [][]byte{
		nil,
		{0xff},
		{0x0a, 0x05, 'a'},
		kubeletCreate(f),
		createMap(f, "config.annotations", 3, 2, 2),
		createWith(f, "config.envs", 3, keyValue("K", "v")),
	} {
		f.Add(seed)
	}
	plans := make([]*decodePlan, len(interceptedMethods))
	for i, m := range interceptedMethods {
		plans[i] = newDecodePlan(m.newReq().ProtoReflect().Descriptor())
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for i, m := range interceptedMethods {
			_, err := plans[i].decodeCost(m.name, body)
			if err != nil && proto.Unmarshal(body, m.newReq()) == nil {
				t.Fatalf("%s(%x): the walk refused what proto.Unmarshal decodes: %v", m.name, body, err)
			}
		}
	})
}

// BenchmarkDecodeCost: what the walk adds to an intercepted call, beside the decoding itself,
// for a kubelet's CreateContainer request.
func BenchmarkDecodeCost(b *testing.B) {
	msg := kubeletCreate(b)
	plan := newDecodePlan((&runtimeapi.CreateContainerRequest{}).ProtoReflect().Descriptor())
	b.Run("walk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := plan.decodeCost("CreateContainer", msg); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := proto.Unmarshal(msg, new(runtimeapi.CreateContainerRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

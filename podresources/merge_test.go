package podresources

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/testfs"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// The web pod of ns "shop": the kubelet knows it with devices, CPUs and memory, and lists one
// DRA claim (gpu-claim) under its "app" container; podgate prepared a pod-level network claim,
// the same gpu claim, and has one claim not prepared yet.

func netClaim() *pb.Claim {
	return claim("shop", "web-net", "net", "net.example.com/nic=eth1")
}

// gpuClaim's device has claim's driver, net.example.com, as every claim built by claim does.
func gpuClaim() *pb.Claim {
	return claim("shop", "gpu-claim", "gpu", "gpu.example.com/gpu=0")
}

func unpreparedClaim() *pb.Claim {
	c := claim("shop", "web-late", "late", "net.example.com/nic=eth9")
	c.Prepared = false
	return c
}

// kubeletGPU is the kubelet's own entry for gpu-claim, told apart from podgate's by its CDI id.
func kubeletGPU() *v1.DynamicResource {
	return &v1.DynamicResource{ClaimName: "gpu-claim", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
		DriverName: "gpu.example.com", PoolName: "node-a", DeviceName: "gpu-0",
		CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=from-kubelet"}},
	}}}
}

func numa(id int64) *v1.TopologyInfo { return &v1.TopologyInfo{Nodes: []*v1.NUMANode{{ID: id}}} }

func kubeletWeb() *v1.PodResources {
	return &v1.PodResources{
		Name: "web", Namespace: "shop", CpuIds: []int64{4, 5},
		Memory: []*v1.ContainerMemory{{MemoryType: "hugepages-2Mi", Size: 4 << 20, Topology: numa(1)}},
		Containers: []*v1.ContainerResources{
			{
				Name:             "app",
				Devices:          []*v1.ContainerDevices{{ResourceName: "example.com/sriov", DeviceIds: []string{"0000:3b:00.2"}, Topology: numa(0)}},
				CpuIds:           []int64{2, 3},
				Memory:           []*v1.ContainerMemory{{MemoryType: "memory", Size: 1 << 30, Topology: numa(0)}},
				DynamicResources: []*v1.DynamicResource{kubeletGPU()},
			},
			{Name: "sidecar", CpuIds: []int64{6}},
		},
	}
}

// webSpec: the sidecar (a restartable init container) names no claim, app names gpu.
func webSpec() []Container {
	return []Container{{Name: "sidecar"}, {Name: "app", Claims: []string{"gpu"}}}
}

func webPod() *pb.Pod {
	return pod("shop", "web", "uid-web", sandbox(t0), netClaim(), gpuClaim(), unpreparedClaim())
}

func TestMergePod(t *testing.T) {
	tests := []struct {
		name    string
		pod     *pb.Pod
		spec    []Container
		specOK  bool
		kubelet *v1.PodResources
		want    *v1.PodResources
	}{
		{
			name: "kubelet's resources kept; pod-level claim once under the first container, container-level only where named, never twice",
			pod:  webPod(), spec: webSpec(), specOK: true, kubelet: kubeletWeb(),
			want: &v1.PodResources{
				Name: "web", Namespace: "shop", CpuIds: []int64{4, 5},
				Memory: []*v1.ContainerMemory{{MemoryType: "hugepages-2Mi", Size: 4 << 20, Topology: numa(1)}},
				Containers: []*v1.ContainerResources{
					{
						Name:    "app",
						Devices: []*v1.ContainerDevices{{ResourceName: "example.com/sriov", DeviceIds: []string{"0000:3b:00.2"}, Topology: numa(0)}},
						CpuIds:  []int64{2, 3},
						Memory:  []*v1.ContainerMemory{{MemoryType: "memory", Size: 1 << 30, Topology: numa(0)}},
						// gpu-claim stays as the kubelet sent it (its CDI id), not duplicated; the
						// pod-level claim is added.
						DynamicResources: []*v1.DynamicResource{
							{ClaimName: "gpu-claim", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
								DriverName: "gpu.example.com", PoolName: "node-a", DeviceName: "gpu-0",
								CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=from-kubelet"}},
							}}},
							{ClaimName: "web-net", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
								DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-web-net",
								CdiDevices: []*v1.CDIDevice{{Name: "net.example.com/nic=eth1"}},
							}}},
						},
					},
					// sidecar names no claim, and the pod-level one is under app, the first.
					{Name: "sidecar", CpuIds: []int64{6}},
				},
			},
		},
		{
			name: "container-level claim the kubelet does not list goes under the naming container only",
			pod:  pod("shop", "web", "uid-web", sandbox(t0), gpuClaim()), spec: webSpec(), specOK: true,
			kubelet: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{{Name: "app"}, {Name: "sidecar"}}},
			want: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{
				{Name: "app", DynamicResources: []*v1.DynamicResource{
					{ClaimName: "gpu-claim", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-gpu-claim",
						CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=0"}},
					}}},
				}},
				{Name: "sidecar"},
			}},
		},
		{
			name: "unprepared claims are not listed",
			pod:  pod("shop", "web", "uid-web", sandbox(t0), unpreparedClaim()), spec: []Container{{Name: "app", Claims: []string{"late"}}}, specOK: true,
			kubelet: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{{Name: "app"}}},
			want:    &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{{Name: "app"}}},
		},
		{
			name: "spec unknown: every claim once, under the first container the kubelet lists",
			pod:  pod("shop", "web", "uid-web", sandbox(t0), netClaim(), gpuClaim()), specOK: false,
			kubelet: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{{Name: "app"}, {Name: "sidecar"}}},
			want: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{
				{Name: "app", DynamicResources: []*v1.DynamicResource{
					{ClaimName: "web-net", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-web-net",
						CdiDevices: []*v1.CDIDevice{{Name: "net.example.com/nic=eth1"}},
					}}},
					{ClaimName: "gpu-claim", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-gpu-claim",
						CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=0"}},
					}}},
				}},
				{Name: "sidecar"},
			}},
		},
		{
			name: "kubelet does not know the pod (in flight): the spec's containers",
			pod:  pod("shop", "web", "uid-web", nil, netClaim(), gpuClaim()), spec: webSpec(), specOK: true,
			want: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{
				{Name: "sidecar", DynamicResources: []*v1.DynamicResource{
					{ClaimName: "web-net", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-web-net",
						CdiDevices: []*v1.CDIDevice{{Name: "net.example.com/nic=eth1"}},
					}}},
				}},
				{Name: "app", DynamicResources: []*v1.DynamicResource{
					{ClaimName: "gpu-claim", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-gpu-claim",
						CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=0"}},
					}}},
				}},
			}},
		},
		{
			name: "spec containers the kubelet did not list follow the kubelet's",
			pod:  pod("shop", "web", "uid-web", sandbox(t0), netClaim()), spec: webSpec(), specOK: true,
			kubelet: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{{Name: "app", CpuIds: []int64{1}}}},
			want: &v1.PodResources{Name: "web", Namespace: "shop", Containers: []*v1.ContainerResources{
				{Name: "app", CpuIds: []int64{1}, DynamicResources: []*v1.DynamicResource{
					{ClaimName: "web-net", ClaimNamespace: "shop", ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-web-net",
						CdiDevices: []*v1.CDIDevice{{Name: "net.example.com/nic=eth1"}},
					}}},
				}},
				{Name: "sidecar"},
			}},
		},
		{
			// The documented rule: without the spec, claims go under the kubelet's containers;
			// with neither, there is no container to list them under.
			name: "spec unknown and no kubelet answer: no containers",
			pod:  pod("shop", "web", "uid-web", nil, netClaim()), specOK: false,
			want: &v1.PodResources{Name: "web", Namespace: "shop"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var before *v1.PodResources
			if tt.kubelet != nil {
				before = proto.CloneOf(tt.kubelet)
			}
			got := mergePod(tt.pod, tt.spec, tt.specOK, tt.kubelet)
			if !proto.Equal(got, tt.want) {
				t.Errorf("mergePod:\n got %s\nwant %s", prototext.Format(got), prototext.Format(tt.want))
			}
			if tt.kubelet != nil && !proto.Equal(tt.kubelet, before) {
				t.Errorf("mergePod changed the kubelet's answer:\n now %s\nwas %s", prototext.Format(tt.kubelet), prototext.Format(before))
			}
		})
	}
}

// listFixture is a source and a kubelet answer covering every case of mergeList.
func listFixture() (*fakeSource, []*v1.PodResources) {
	older := pod("b", "dup", "uid-dup-old", sandbox(t0), claim("b", "dup-old-net", "net"))
	newer := pod("b", "dup", "uid-dup-new", sandbox(t0.Add(time.Minute)), claim("b", "dup-new-net", "net"))
	running := pod("b", "dup2", "uid-dup2-old", sandbox(t0), claim("b", "dup2-old-net", "net"))
	inFlight := pod("b", "dup2", "uid-dup2-new", nil, claim("b", "dup2-new-net", "net"))
	src := &fakeSource{
		specs: map[string][]Container{
			"uid-web": webSpec(), "uid-dup-old": {{Name: "c"}}, "uid-dup-new": {{Name: "c"}},
			"uid-dup2-old": {{Name: "c"}}, "uid-dup2-new": {{Name: "c"}}, "uid-only": {{Name: "main"}},
		},
	}
	web := webPod()
	web.Namespace = "b"
	for _, c := range web.GetClaims() {
		c.Namespace = "b"
	}
	// Deliberately unordered, the older pod of each name first in one case and last in the other.
	src.set(7, pod("c", "only-podgate", "uid-only", nil, claim("c", "only-net", "net")), older, web, inFlight, newer, running)
	kweb := kubeletWeb()
	kweb.Namespace = "b"
	kweb.Containers[0].DynamicResources[0].ClaimNamespace = "b"
	kubelet := []*v1.PodResources{
		kweb,
		{Name: "zz-only-kubelet", Namespace: "a", Containers: []*v1.ContainerResources{{Name: "k", CpuIds: []int64{9}}}},
	}
	return src, kubelet
}

// mergedWebIn is the v1 answer for the web pod moved to namespace ns, written out: the
// kubelet's resources with the pod-level claim under both containers and the kubelet's
// gpu-claim kept once.
func mergedWebIn(ns string) *v1.PodResources {
	return &v1.PodResources{
		Name: "web", Namespace: ns, CpuIds: []int64{4, 5},
		Memory: []*v1.ContainerMemory{{MemoryType: "hugepages-2Mi", Size: 4 << 20, Topology: numa(1)}},
		Containers: []*v1.ContainerResources{
			{
				Name:    "app",
				Devices: []*v1.ContainerDevices{{ResourceName: "example.com/sriov", DeviceIds: []string{"0000:3b:00.2"}, Topology: numa(0)}},
				CpuIds:  []int64{2, 3},
				Memory:  []*v1.ContainerMemory{{MemoryType: "memory", Size: 1 << 30, Topology: numa(0)}},
				DynamicResources: []*v1.DynamicResource{
					{ClaimName: "gpu-claim", ClaimNamespace: ns, ClaimResources: []*v1.ClaimResource{{
						DriverName: "gpu.example.com", PoolName: "node-a", DeviceName: "gpu-0",
						CdiDevices: []*v1.CDIDevice{{Name: "gpu.example.com/gpu=from-kubelet"}},
					}}},
					{ClaimName: "web-net", ClaimNamespace: ns, ClaimResources: []*v1.ClaimResource{{
						DriverName: "net.example.com", PoolName: "node-a", DeviceName: "dev-web-net",
						CdiDevices: []*v1.CDIDevice{{Name: "net.example.com/nic=eth1"}},
					}}},
				},
			},
			{Name: "sidecar", CpuIds: []int64{6}},
		},
	}
}

func TestMergeList(t *testing.T) {
	src, kubelet := listFixture()
	pods, _ := src.Pods()
	got := mergeList(pods, src, kubelet)

	var order []string
	byName := map[string]*v1.PodResources{}
	for _, pr := range got {
		order = append(order, pr.GetNamespace()+"/"+pr.GetName())
		byName[pr.GetNamespace()+"/"+pr.GetName()] = pr
	}
	wantOrder := []string{"a/zz-only-kubelet", "b/dup", "b/dup2", "b/web", "c/only-podgate"}
	if len(order) != len(wantOrder) {
		t.Fatalf("List holds %v, want %v", order, wantOrder)
	}
	for i := range order {
		if order[i] != wantOrder[i] {
			t.Fatalf("List order %v, want %v (by namespace, then name)", order, wantOrder)
		}
	}

	if !proto.Equal(byName["a/zz-only-kubelet"], kubelet[1]) {
		t.Errorf("a pod only the kubelet knows changed: %s", prototext.Format(byName["a/zz-only-kubelet"]))
	}
	claimsOf := func(pr *v1.PodResources) []string {
		var names []string
		for _, c := range pr.GetContainers() {
			for _, d := range c.GetDynamicResources() {
				names = append(names, c.GetName()+":"+d.GetClaimName())
			}
		}
		return names
	}
	for _, tc := range []struct{ pod, want string }{
		{"b/dup", "c:dup-new-net"},          // the sandbox created last wins
		{"b/dup2", "c:dup2-new-net"},        // a pod in flight (no sandbox yet) is the newest
		{"c/only-podgate", "main:only-net"}, // in flight, unknown to the kubelet: listed from the spec
		{"b/web", "app:gpu-claim app:web-net"},
	} {
		got := claimsOf(byName[tc.pod])
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("%s: claims %q, want %q", tc.pod, s, tc.want)
		}
	}
	if wantWeb := mergedWebIn("b"); !proto.Equal(byName["b/web"], wantWeb) {
		t.Errorf("b/web:\n got %s\nwant %s", prototext.Format(byName["b/web"]), prototext.Format(wantWeb))
	}
}

func TestNewer(t *testing.T) {
	tests := []struct {
		name string
		a, b *pb.Sandbox
		want bool
	}{
		{"in flight beats a created sandbox", nil, sandbox(t0), true},
		{"a created sandbox loses to one in flight", sandbox(t0), nil, false},
		{"both in flight: not newer", nil, nil, false},
		{"created later", sandbox(t0.Add(time.Second)), sandbox(t0), true},
		{"created earlier", sandbox(t0), sandbox(t0.Add(time.Second)), false},
		{"created at the same time: not newer", sandbox(t0), sandbox(t0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := pod("ns", "p", "a", tt.a), pod("ns", "p", "b", tt.b)
			if got := Newer(a, b); got != tt.want {
				t.Errorf("Newer = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestV1MergesKubelet checks the merge end to end: podgate's v1 service in front of a fake
// kubelet, both on unix sockets.
func TestV1MergesKubelet(t *testing.T) {
	ctx := testContext(t)
	src, kpods := listFixture()
	allocatable := &v1.AllocatableResourcesResponse{CpuIds: []int64{0, 1, 2, 3}, Devices: []*v1.ContainerDevices{{ResourceName: "example.com/sriov", DeviceIds: []string{"0000:3b:00.2", "0000:3b:00.3"}}}}
	r := newRigWithKubelet(t, src, &fakeKubelet{pods: kpods, allocatable: allocatable})
	client := r.v1()

	list, err := client.List(ctx, &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	pods, _ := src.Pods()
	if want := mergeList(pods, src, kpods); !equalList(list.GetPodResources(), want) {
		t.Errorf("List:\n got %s\nwant %v", prototext.Format(list), want)
	}

	// Spelt out, not only compared with mergeList: the kubelet's part did arrive.
	if got := list.GetPodResources(); len(got) != 5 || !proto.Equal(got[3], mergedWebIn("b")) || !proto.Equal(got[0], kpods[1]) {
		t.Errorf("List does not hold the kubelet's pod first and the merged b/web fourth:\n%s", prototext.Format(list))
	}

	for _, tc := range []struct{ namespace, name string }{
		{"b", "web"}, {"a", "zz-only-kubelet"}, {"c", "only-podgate"}, {"b", "dup"}, {"b", "dup2"},
	} {
		resp, err := client.Get(ctx, &v1.GetPodResourcesRequest{PodNamespace: tc.namespace, PodName: tc.name})
		if err != nil {
			t.Errorf("Get %s/%s: %v", tc.namespace, tc.name, err)
			continue
		}
		var want *v1.PodResources
		for _, pr := range list.GetPodResources() {
			if pr.GetNamespace() == tc.namespace && pr.GetName() == tc.name {
				want = pr
			}
		}
		if !proto.Equal(resp.GetPodResources(), want) {
			t.Errorf("Get %s/%s:\n got %s\nwant the List entry %s", tc.namespace, tc.name, prototext.Format(resp), prototext.Format(want))
		}
	}

	alloc, err := client.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(alloc, allocatable) {
		t.Errorf("GetAllocatableResources: got %s, want the kubelet's %s", prototext.Format(alloc), prototext.Format(allocatable))
	}
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_up"); got != 1 {
		t.Errorf("kubelet_up = %v, want 1", got)
	}
	// c/only-podgate is unknown to the kubelet: its Get was answered by the kubelet with its
	// not-found error, which is no failure of the kubelet.
	if got := metricValue(t, r.metrics, "podgate_podresources_kubelet_requests_total", "method", "Get", "result", "not_found"); got < 1 {
		t.Errorf("kubelet_requests_total{Get,not_found} = %v, want at least 1", got)
	}
}

func equalList(a, b []*v1.PodResources) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// newRigWithKubelet serves a fake kubelet and a podgate server merging it.
func newRigWithKubelet(t *testing.T, src Source, k *fakeKubelet) *rig {
	t.Helper()
	dir := testfs.ShortDir(t)
	serveKubelet(t, dir+"/kubelet.sock", k, false)
	return newRigIn(t, dir, Options{Source: src, KubeletSocket: dir + "/kubelet.sock"})
}

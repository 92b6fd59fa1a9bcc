package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/cni/cnitest"
	"github.com/podgate/podgate/test/testfs"
	"github.com/podgate/podgate/test/testnet"
)

// fakePodgate serves the two PodResources services with answers a test sets.
type fakePodgate struct {
	socket string

	mu    sync.Mutex
	pod   *pb.Pod          // nil: NotFound
	v1Pod *v1.PodResources // nil: NotFound
	err   error            // every call fails with it
}

// set changes the answers.
func (f *fakePodgate) set(pod *pb.Pod, v1Pod *v1.PodResources) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pod, f.v1Pod = pod, v1Pod
}

func (f *fakePodgate) answers() (*pb.Pod, *v1.PodResources, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pod, f.v1Pod, f.err
}

// extensionServer is fakePodgate's podgate.podresources.v1alpha1.PodResources.
type extensionServer struct {
	pb.UnimplementedPodResourcesServer
	f *fakePodgate
}

func (s extensionServer) Get(_ context.Context, req *pb.GetRequest) (*pb.GetResponse, error) {
	pod, _, err := s.f.answers()
	if err != nil {
		return nil, err
	}
	if pod == nil || pod.GetName() != req.GetPodName() || pod.GetNamespace() != req.GetPodNamespace() {
		return nil, status.Error(codes.NotFound, "not known to podgate")
	}
	return &pb.GetResponse{Pod: pod}, nil
}

// v1Server is fakePodgate's v1.PodResourcesLister.
type v1Server struct {
	v1.UnimplementedPodResourcesListerServer
	f *fakePodgate
}

func (s v1Server) Get(_ context.Context, req *v1.GetPodResourcesRequest) (*v1.GetPodResourcesResponse, error) {
	_, pod, err := s.f.answers()
	if err != nil {
		return nil, err
	}
	if pod == nil || pod.GetName() != req.GetPodName() || pod.GetNamespace() != req.GetPodNamespace() {
		return nil, status.Error(codes.NotFound, "not found")
	}
	return &v1.GetPodResourcesResponse{PodResources: pod}, nil
}

func startFakePodgate(t *testing.T, f *fakePodgate) *fakePodgate {
	t.Helper()
	f.socket = filepath.Join(testfs.ShortDir(t), "pr.sock")
	l, err := net.Listen("unix", f.socket)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterPodResourcesServer(s, extensionServer{f: f})
	v1.RegisterPodResourcesListerServer(s, v1Server{f: f})
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	t.Cleanup(func() {
		s.Stop()
		if err := <-done; err != nil {
			t.Errorf("fake podgate: %v", err)
		}
	})
	return f
}

const prevResult = `{"cniVersion":"1.0.0",
 "interfaces":[{"name":"pgrig9","mac":"aa:bb:cc:00:00:01"},{"name":"veth1234","mac":"aa:bb:cc:00:00:02"},
               {"name":"eth0","mac":"aa:bb:cc:00:00:03","sandbox":"/run/netns/x"}],
 "ips":[{"interface":2,"address":"10.77.9.5/24","gateway":"10.77.9.1"}]}`

// pluginConf is the plugin's configuration for the fake podgate, with files in dir.
func pluginConf(t *testing.T, socket, dir string) []byte {
	t.Helper()
	b, err := json.Marshal(map[string]any{
		"cniVersion": "1.0.0", "name": "pgtest", "type": "pgmetacni",
		"podResourcesSocket": socket,
		"recordFile":         filepath.Join(dir, "record.jsonl"),
		"cacheDir":           filepath.Join(dir, "cache"),
		"prevResult":         json.RawMessage(prevResult),
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAddUnknownPod: a pod podgate does not know has no devices; its previous result passes
// through and nothing is cached. It needs no root: nothing is moved.
func TestAddUnknownPod(t *testing.T) {
	f := startFakePodgate(t, &fakePodgate{})
	dir := t.TempDir()
	out, err := cnitest.Call{Namespace: "default", Name: "web", CNIPath: []string{"/usr/lib/cni"}, Command: "ADD", ContainerID: "c1", Netns: "/nonexistent/netns", Stdin: pluginConf(t, f.socket, dir)}.Run(t, pluginPath)
	if err != nil {
		t.Fatal(err)
	}
	requireSameJSON(t, out, prevResult)
	e := lastEntry(t, filepath.Join(dir, "record.jsonl"))
	if e.Command != "ADD" || e.Pod != (podRef{Namespace: "default", Name: "web", UID: "uid-1"}) ||
		e.Extension == nil || e.Extension.Found || e.V1 == nil || e.V1.Found || len(e.Delegated) != 0 || len(e.Errors) != 0 {
		t.Errorf("ADD entry %s", mustJSON(t, e))
	}
	if _, err := os.Stat(filepath.Join(dir, "cache")); !os.IsNotExist(err) {
		t.Errorf("cache directory made for a pod without devices: %v", err)
	}
}

// TestAddFailsClosed: any error from podgate other than NotFound fails the ADD, with a message
// naming the call and the pod, and is recorded.
func TestAddFailsClosed(t *testing.T) {
	unavailable := startFakePodgate(t, &fakePodgate{err: status.Error(codes.Unavailable, "podgate is stopping")})
	for _, tc := range []struct {
		name, socket, want string
	}{
		{name: "error status", socket: unavailable.socket, want: "podgate PodResources Get default/web: rpc error: code = Unavailable desc = podgate is stopping"},
		{name: "no socket", socket: filepath.Join(testfs.ShortDir(t), "missing.sock"), want: "podgate PodResources Get default/web: rpc error: code = Unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			out, err := cnitest.Call{Namespace: "default", Name: "web", CNIPath: []string{"/usr/lib/cni"}, Command: "ADD", ContainerID: "c1", Netns: "/nonexistent/netns", Stdin: pluginConf(t, tc.socket, dir)}.Run(t, pluginPath)
			if err == nil {
				t.Fatalf("ADD succeeded: %s", out)
			}
			var cniErr types.Error
			if jerr := json.Unmarshal(out, &cniErr); jerr != nil || !strings.Contains(cniErr.Msg, tc.want) || !strings.HasPrefix(cniErr.Msg, "pgmetacni: ") {
				t.Errorf("error output %s (%v), want a CNI error with %q", out, jerr, tc.want)
			}
			if e := lastEntry(t, filepath.Join(dir, "record.jsonl")); len(e.Errors) != 1 || !strings.Contains(e.Errors[0], tc.want) {
				t.Errorf("ADD entry %s, want the error recorded", mustJSON(t, e))
			}
		})
	}
}

// TestDelWithoutCache: DEL of a container the plugin delegated nothing for succeeds (CNI DEL is
// idempotent), without asking podgate: the socket does not even exist.
func TestDelWithoutCache(t *testing.T) {
	dir := t.TempDir()
	out, err := cnitest.Call{Namespace: "default", Name: "web", CNIPath: []string{"/usr/lib/cni"}, Command: "DEL", ContainerID: "c1", Netns: "", Stdin: pluginConf(t, "/nonexistent/pr.sock", dir)}.Run(t, pluginPath)
	if err != nil || len(out) != 0 {
		t.Fatalf("DEL: %v, output %q", err, out)
	}
	if e := lastEntry(t, filepath.Join(dir, "record.jsonl")); e.Command != "DEL" || len(e.Delegated) != 0 || len(e.Errors) != 0 {
		t.Errorf("DEL entry %s", mustJSON(t, e))
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	if out, err := (cnitest.Call{Namespace: "default", Name: "web", CNIPath: []string{"/usr/lib/cni"}, Command: "CHECK", ContainerID: "c1", Netns: "/x", Stdin: pluginConf(t, "/run/pr.sock", dir)}).Run(t, pluginPath); err != nil || len(out) != 0 {
		t.Errorf("CHECK: %v, output %q", err, out)
	}
	out, err := cnitest.Call{Namespace: "default", Name: "web", CNIPath: []string{"/usr/lib/cni"}, Command: "CHECK", ContainerID: "c1", Netns: "/x", Stdin: []byte(`{"cniVersion":"1.0.0","name":"n","type":"pgmetacni","prevResult":` + prevResult + `}`)}.Run(t, pluginPath)
	if err == nil || !strings.Contains(string(out), "podResourcesSocket is required") {
		t.Errorf("CHECK of a configuration without its keys: %v, output %s", err, out)
	}
}

// TestAddDelHostDevice runs the plugin as containerd would on a host, with the real host-device:
// inside a namespace the test made (the "host"), which holds a veth pair standing for a
// prepared DRA device, with CNI_NETNS a second namespace (the pod's).
func TestAddDelHostDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and moves a veth between them")
	}
	if _, err := os.Stat("/usr/lib/cni/host-device"); err != nil {
		t.Skipf("host-device plugin missing (apt-get install containernetworking-plugins): %v", err)
	}
	host := testnet.New(t, "pgmeta")
	pod := testnet.New(t, "pgmeta")
	if err := host.Handle.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pgmeta0"}, PeerName: "pgmeta0p"}); err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	hostLink, err := host.Handle.LinkByName("pgmeta0")
	if err != nil {
		t.Fatal(err)
	}
	f := startFakePodgate(t, &fakePodgate{
		pod: &pb.Pod{Name: "web", Namespace: "default", Uid: "uid-1", Claims: []*pb.Claim{{
			Namespace: "default", Name: "web-nic", PodClaimName: "nic", Prepared: true,
			Devices: []*pb.Device{netDevice("nic0", "pgmeta0", "net1", false)},
		}}},
		v1Pod: &v1.PodResources{Name: "web", Namespace: "default", Containers: []*v1.ContainerResources{{
			Name: "c", DynamicResources: []*v1.DynamicResource{{ClaimName: "web-nic", ClaimNamespace: "default",
				ClaimResources: []*v1.ClaimResource{{DriverName: "net.podgate.test", PoolName: "node1", DeviceName: "nic0"}}}},
		}}},
	})
	dir := t.TempDir()
	recordFile := filepath.Join(dir, "record.jsonl")
	call := cnitest.Call{Namespace: "default", Name: "web", CNIPath: []string{"/usr/lib/cni"}, ContainerID: "ctr1", Netns: pod.Path, InNetns: host.Name, Stdin: pluginConf(t, f.socket, dir)}

	call.Command = "ADD"
	out, err := call.Run(t, pluginPath)
	if err != nil {
		t.Fatal(err)
	}
	res, err := current.NewResult(out)
	if err != nil {
		t.Fatalf("ADD output %s: %v", out, err)
	}
	r := res.(*current.Result)
	if n := len(r.Interfaces); n != 4 || r.Interfaces[3].Name != "net1" || r.Interfaces[3].Sandbox != pod.Path || r.Interfaces[3].Mac != hostLink.Attrs().HardwareAddr.String() {
		t.Errorf("ADD result %s, want the bridge's three interfaces and net1 in the pod", out)
	}
	if l, err := pod.Handle.LinkByName("net1"); err != nil || l.Attrs().Alias != "pgmeta0" {
		t.Errorf("net1 in the pod: %v %v", l, err)
	}
	if _, err := host.Handle.LinkByName("pgmeta0"); err == nil {
		t.Error("pgmeta0 still on the host after ADD")
	}
	add := lastEntry(t, recordFile)
	wantV1 := &v1Answer{Found: true, Containers: []v1Container{{Name: "c", DynamicResources: []dynamicResource{{
		ClaimNamespace: "default", ClaimName: "web-nic", Devices: []claimDevice{{Driver: "net.podgate.test", Pool: "node1", Device: "nic0"}},
	}}}}}
	if add.Extension == nil || !add.Extension.Found || len(add.Extension.Devices) != 1 || add.Extension.Devices[0].HostInterface != "pgmeta0" ||
		!reflect.DeepEqual(add.V1, wantV1) || len(add.Delegated) != 1 || add.Delegated[0].IfName != "net1" || len(add.Errors) != 0 {
		t.Errorf("ADD entry %s", mustJSON(t, add))
	}

	call.Command = "CHECK"
	if out, err := call.Run(t, pluginPath); err != nil || len(out) != 0 {
		t.Errorf("CHECK: %v, output %q", err, out)
	}

	// podgate forgot the pod: DEL works from the cache.
	f.set(nil, nil)
	call.Command = "DEL"
	if out, err := call.Run(t, pluginPath); err != nil || len(out) != 0 {
		t.Fatalf("DEL: %v, output %q", err, out)
	}
	if _, err := host.Handle.LinkByName("pgmeta0"); err != nil {
		t.Errorf("pgmeta0 not back on the host after DEL: %v", err)
	}
	if _, err := pod.Handle.LinkByName("net1"); err == nil {
		t.Error("net1 still in the pod after DEL")
	}
	if del := lastEntry(t, recordFile); len(del.Delegated) != 1 || del.Delegated[0].Skipped != "" || del.Delegated[0].Error != "" || len(del.Errors) != 0 {
		t.Errorf("DEL entry %s", mustJSON(t, del))
	}
	// Again: nothing left to give back.
	if out, err := call.Run(t, pluginPath); err != nil || len(out) != 0 {
		t.Fatalf("second DEL: %v, output %q", err, out)
	}

	// The pod's namespace is gone before DEL (it took the veth with it): DEL succeeds and
	// forgets the container.
	f.set(&pb.Pod{Name: "web", Namespace: "default", Claims: []*pb.Claim{{Namespace: "default", Name: "web-nic",
		Devices: []*pb.Device{netDevice("nic0", "pgmeta0", "net1", false)}}}}, nil)
	gone := fmt.Sprintf("pgmeta-gone-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", gone).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", gone).Run() }) // gone already unless the test failed early
	call.ContainerID, call.Netns = "ctr2", filepath.Join("/run/netns", gone)
	call.Command = "ADD"
	if _, err := call.Run(t, pluginPath); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "del", gone).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v %s", err, out)
	}
	call.Command = "DEL"
	if out, err := call.Run(t, pluginPath); err != nil || len(out) != 0 {
		t.Fatalf("DEL after the namespace went: %v, output %q", err, out)
	}
	if del := lastEntry(t, recordFile); len(del.Delegated) != 1 || del.Delegated[0].Skipped == "" {
		t.Errorf("DEL entry %s, want the delegation skipped", mustJSON(t, del))
	}
	if _, ok, err := readCache(filepath.Join(dir, "cache"), "ctr2"); ok || err != nil {
		t.Errorf("cache of ctr2 after DEL: %v %v", ok, err)
	}
}

func requireSameJSON(t *testing.T, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("stdout %s: %v", got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("stdout = %s\nwant %s", got, want)
	}
}

func lastEntry(t *testing.T, path string) Entry {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var last Entry
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s line %d: %v", path, n+1, err)
		}
		last = e
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Fatal("record file is empty")
	}
	return last
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

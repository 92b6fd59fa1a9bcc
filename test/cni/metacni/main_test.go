package main

import (
	"bufio"
	"bytes"
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
	"github.com/podgate/podgate/test/testfs"
	"github.com/podgate/podgate/test/testnet"
)

// pluginPath is the plugin binary built once by TestMain, as a runtime would find it in a CNI
// bin directory.
var pluginPath string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "pgmetacni")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		pluginPath = filepath.Join(dir, "pgmetacni")
		if out, err := exec.Command("go", "build", "-o", pluginPath, ".").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
}

func TestParseConf(t *testing.T) {
	const valid = `"cniVersion":"1.0.0","name":"pgrig","type":"pgmetacni","podResourcesSocket":"/run/pr.sock","recordFile":"/tmp/r.jsonl","cacheDir":"/tmp/c"`
	for _, tc := range []struct {
		name, conf string
		wantErr    []string // substrings of the error; nil = valid
	}{
		{name: "valid", conf: `{` + valid + `}`},
		{name: "valid with prevResult", conf: `{` + valid + `,"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}]}}`},
		{name: "empty", conf: `{"cniVersion":"1.0.0","name":"n","type":"pgmetacni"}`,
			wantErr: []string{"podResourcesSocket is required", "recordFile is required", "cacheDir is required"}},
		{name: "relative paths", conf: `{"cniVersion":"1.0.0","name":"n","podResourcesSocket":"pr.sock","recordFile":"r","cacheDir":"c"}`,
			wantErr: []string{`podResourcesSocket: "pr.sock": want an absolute path`, `recordFile: "r"`, `cacheDir: "c"`}},
		{name: "no name", conf: `{"cniVersion":"1.0.0","podResourcesSocket":"/a","recordFile":"/b","cacheDir":"/c"}`, wantErr: []string{"name is required"}},
		{name: "no cniVersion", conf: `{"name":"n","podResourcesSocket":"/a","recordFile":"/b","cacheDir":"/c"}`, wantErr: []string{"cniVersion is required"}},
		{name: "not JSON", conf: `{`, wantErr: []string{"decode network configuration"}},
		{name: "bad prevResult", conf: `{` + valid + `,"prevResult":{"cniVersion":"1.0.0","interfaces":"eth0"}}`, wantErr: []string{"prevResult"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf, err := parseConf([]byte(tc.conf))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				if conf.PodResourcesSocket != "/run/pr.sock" || conf.RecordFile != "/tmp/r.jsonl" || conf.CacheDir != "/tmp/c" || conf.Name != "pgrig" {
					t.Errorf("conf = %+v", conf)
				}
				if strings.Contains(tc.conf, "prevResult") && conf.PrevResult == nil {
					t.Error("prevResult not parsed")
				}
				return
			}
			if err == nil {
				t.Fatalf("parseConf succeeded: %+v", conf)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q lacks %q", err, want)
				}
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		name, args string
		want       podRef
		wantErr    bool
	}{
		{
			name: "containerd's", args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=uid-1",
			want: podRef{Namespace: "ns1", Name: "pod1", UID: "uid-1"},
		},
		{name: "unknown key ignored", args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;OTHER=x", want: podRef{Namespace: "ns1", Name: "pod1"}},
		{name: "unknown key refused", args: "K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;OTHER=x", wantErr: true},
		{name: "malformed", args: "K8S_POD_NAME", wantErr: true},
		{name: "none", args: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseArgs(tc.args)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseArgs(%q) error %v, want error %v", tc.args, err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("parseArgs(%q) = %+v, want %+v", tc.args, got, tc.want)
			}
			if got.known() != (tc.want.Name != "") {
				t.Errorf("known() = %v", got.known())
			}
		})
	}
}

// netDevice is a prepared device of the test driver with network data.
func netDevice(device, host, name string, attached bool) *pb.Device {
	return &pb.Device{Driver: "net.podgate.test", Pool: "node1", Device: device,
		Network: &pb.NetworkData{HostInterface: host, InterfaceName: name, Attached: attached}}
}

func TestPlan(t *testing.T) {
	conf := &NetConf{PluginConf: types.PluginConf{CNIVersion: "1.0.0", Name: "pgrig"}}
	pod := &pb.Pod{Name: "web", Namespace: "default", Claims: []*pb.Claim{
		{Namespace: "default", Name: "web-nic", Prepared: true, Devices: []*pb.Device{
			netDevice("nic0", "pgnic0", "net1", false),
			netDevice("nic1", "pgnic1", "", false),                 // no name asked: the host's
			netDevice("nic2", "pgnic2", "net2", true),              // podgate attached it itself
			{Driver: "gpu.example.com", Pool: "p", Device: "gpu0"}, // no network data
		}},
	}}
	got, err := plan(conf, pod, "eth0")
	if err != nil {
		t.Fatal(err)
	}
	want := []delegation{
		{Plugin: "host-device", HostInterface: "pgnic0", IfName: "net1",
			Conf: json.RawMessage(`{"cniVersion":"1.0.0","name":"pgrig","type":"host-device","device":"pgnic0"}`)},
		{Plugin: "host-device", HostInterface: "pgnic1", IfName: "pgnic1",
			Conf: json.RawMessage(`{"cniVersion":"1.0.0","name":"pgrig","type":"host-device","device":"pgnic1"}`)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plan = %s\nwant %s", mustJSON(t, got), mustJSON(t, want))
	}
	if ds, err := plan(conf, &pb.Pod{}, "eth0"); err != nil || len(ds) != 0 {
		t.Errorf("plan of a pod without claims = %v, %v", ds, err)
	}

	for _, tc := range []struct {
		name    string
		devices []*pb.Device
		want    string
	}{
		{name: "two devices, one name", devices: []*pb.Device{netDevice("nic0", "pgnic0", "net1", false), netDevice("nic1", "pgnic1", "net1", false)},
			want: `interface name "net1" in the pod is also device net.podgate.test/node1/nic0 of claim default/c's`},
		{name: "the chain's own interface", devices: []*pb.Device{netDevice("nic0", "pgnic0", "eth0", false)},
			want: `interface name "eth0" in the pod is also CNI_IFNAME's`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &pb.Pod{Claims: []*pb.Claim{{Namespace: "default", Name: "c", Devices: tc.devices}}}
			if _, err := plan(conf, pod, "eth0"); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("plan error %v, want %q", err, tc.want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	prev100 := `{"cniVersion":"1.0.0",
	 "interfaces":[{"name":"pgrig9","mac":"aa:bb:cc:00:00:01"},{"name":"veth1234","mac":"aa:bb:cc:00:00:02"},
	               {"name":"eth0","mac":"aa:bb:cc:00:00:03","sandbox":"/run/netns/x"}],
	 "ips":[{"interface":2,"address":"10.77.9.5/24","gateway":"10.77.9.1"}],
	 "routes":[{"dst":"10.77.0.0/16"}],
	 "dns":{"nameservers":["127.0.0.1"]}}`
	prev040 := `{"cniVersion":"0.4.0",
	 "interfaces":[{"name":"pgrig9"},{"name":"veth1234"},{"name":"eth0","sandbox":"/run/netns/x"}],
	 "ips":[{"version":"4","interface":2,"address":"10.77.9.5/24","gateway":"10.77.9.1"}],
	 "routes":[{"dst":"10.77.0.0/16"}],
	 "dns":{"nameservers":["127.0.0.1"]}}`
	// host-device with IPAM would report an address of its interface, 0 in its own result.
	delegate := `{"cniVersion":"1.0.0",
	 "interfaces":[{"name":"net1","mac":"ca:18:e7:96:b9:fb","sandbox":"/run/netns/x"}],
	 "ips":[{"interface":0,"address":"192.0.2.10/24"}],
	 "routes":[{"dst":"192.0.2.0/24"}],
	 "dns":{"nameservers":["192.0.2.53"]}}`

	for _, tc := range []struct {
		name, prev string
		wantIfaces []string
		wantIPs    map[string]int // address → interface index
		wantRoutes int
		wantDNS    []string
	}{
		{name: "after bridge, 1.0.0", prev: prev100, wantIfaces: []string{"pgrig9", "veth1234", "eth0", "net1"},
			wantIPs: map[string]int{"10.77.9.5/24": 2, "192.0.2.10/24": 3}, wantRoutes: 2, wantDNS: []string{"127.0.0.1"}},
		{name: "after bridge, 0.4.0", prev: prev040, wantIfaces: []string{"pgrig9", "veth1234", "eth0", "net1"},
			wantIPs: map[string]int{"10.77.9.5/24": 2, "192.0.2.10/24": 3}, wantRoutes: 2, wantDNS: []string{"127.0.0.1"}},
		{name: "first in chain", wantIfaces: []string{"net1"}, wantIPs: map[string]int{"192.0.2.10/24": 0}, wantRoutes: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var prev types.Result
			if tc.prev != "" {
				prev = parseResult(t, tc.prev)
			}
			r, err := startResult(prev)
			if err != nil {
				t.Fatal(err)
			}
			if err := merge(r, parseResult(t, delegate)); err != nil {
				t.Fatal(err)
			}
			var ifaces []string
			for _, i := range r.Interfaces {
				ifaces = append(ifaces, i.Name)
			}
			if !reflect.DeepEqual(ifaces, tc.wantIfaces) {
				t.Errorf("interfaces %v, want %v", ifaces, tc.wantIfaces)
			}
			ips := map[string]int{}
			for _, ip := range r.IPs {
				ips[ip.Address.String()] = *ip.Interface
			}
			if !reflect.DeepEqual(ips, tc.wantIPs) {
				t.Errorf("IPs %v, want %v", ips, tc.wantIPs)
			}
			if len(r.Routes) != tc.wantRoutes || !reflect.DeepEqual(r.DNS.Nameservers, tc.wantDNS) {
				t.Errorf("routes %v, DNS %+v; want %d routes, DNS %v", r.Routes, r.DNS, tc.wantRoutes, tc.wantDNS)
			}
			if r.Interfaces[len(r.Interfaces)-1].Mac != "ca:18:e7:96:b9:fb" || r.Interfaces[len(r.Interfaces)-1].Sandbox != "/run/netns/x" {
				t.Errorf("delegate's interface %+v", r.Interfaces[len(r.Interfaces)-1])
			}
		})
	}

	r, err := startResult(nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := parseResult(t, `{"cniVersion":"1.0.0","interfaces":[{"name":"net1"}],"ips":[{"interface":1,"address":"192.0.2.10/24"}]}`)
	if err := merge(r, bad); err == nil || !strings.Contains(err.Error(), "names interface 1 of 1") {
		t.Errorf("merge of a result whose IP names a missing interface: %v", err)
	}
}

func parseResult(t *testing.T, s string) types.Result {
	t.Helper()
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	var (
		r   types.Result
		err error
	)
	if v.CNIVersion == "1.0.0" {
		r, err = current.NewResult([]byte(s))
	} else {
		r, err = parseVersioned(v.CNIVersion, s)
	}
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// parseVersioned parses a result of an older version the way the plugin gets its prevResult.
func parseVersioned(ver, s string) (types.Result, error) {
	conf, err := parseConf(fmt.Appendf(nil, `{"cniVersion":%q,"name":"n","podResourcesSocket":"/a","recordFile":"/b","cacheDir":"/c","prevResult":%s}`, ver, s))
	if err != nil {
		return nil, err
	}
	return conf.PrevResult, nil
}

func TestCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cache")
	e := cacheEntry{ContainerID: "0123abc", Netns: "/run/netns/x", Pod: podRef{Namespace: "default", Name: "web"}, Delegations: []delegation{
		{Plugin: "host-device", HostInterface: "pgnic0", IfName: "net1", Conf: json.RawMessage(`{"cniVersion":"1.0.0","name":"n","type":"host-device","device":"pgnic0"}`)},
	}}
	if _, ok, err := readCache(dir, "0123abc"); ok || err != nil {
		t.Fatalf("readCache before any write: %v, %v", ok, err)
	}
	if err := writeCache(dir, e); err != nil {
		t.Fatal(err)
	}
	got, ok, err := readCache(dir, "0123abc")
	if err != nil || !ok || !reflect.DeepEqual(got, e) {
		t.Errorf("readCache = %+v, %v, %v; want %+v", got, ok, err, e)
	}
	for range 2 { // removing twice: the second finds nothing, which is fine
		if err := removeCache(dir, "0123abc"); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok, err := readCache(dir, "0123abc"); ok || err != nil {
		t.Errorf("readCache after remove: %v, %v", ok, err)
	}
	for _, id := range []string{"", ".", "..", "../x", "a/b"} {
		if _, err := cachePath(dir, id); err == nil {
			t.Errorf("cachePath(%q) accepted", id)
		}
	}
}

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

// cniCall is one plugin invocation, with the environment containerd sets.
type cniCall struct {
	command, containerID, netns string
	inNetns                     string // run the plugin inside this named namespace ("" = here)
	stdin                       []byte
}

// run invokes the plugin and returns its stdout; a non-zero exit is an error carrying stdout,
// where CNI plugins print their error object.
func (c cniCall) run(t *testing.T) ([]byte, error) {
	t.Helper()
	argv := []string{pluginPath}
	if c.inNetns != "" {
		argv = append([]string{"ip", "netns", "exec", c.inNetns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{
		"CNI_COMMAND=" + c.command,
		"CNI_CONTAINERID=" + c.containerID,
		"CNI_NETNS=" + c.netns,
		"CNI_IFNAME=eth0",
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=" + c.containerID + ";K8S_POD_UID=uid-1",
		"CNI_PATH=" + filepath.Dir(pluginPath) + ":/usr/lib/cni",
		"PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(c.stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: stdout %s stderr %s", c.command, strings.Join(argv, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
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
	out, err := cniCall{command: "ADD", containerID: "c1", netns: "/nonexistent/netns", stdin: pluginConf(t, f.socket, dir)}.run(t)
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
			out, err := cniCall{command: "ADD", containerID: "c1", netns: "/nonexistent/netns", stdin: pluginConf(t, tc.socket, dir)}.run(t)
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
	out, err := cniCall{command: "DEL", containerID: "c1", netns: "", stdin: pluginConf(t, "/nonexistent/pr.sock", dir)}.run(t)
	if err != nil || len(out) != 0 {
		t.Fatalf("DEL: %v, output %q", err, out)
	}
	if e := lastEntry(t, filepath.Join(dir, "record.jsonl")); e.Command != "DEL" || len(e.Delegated) != 0 || len(e.Errors) != 0 {
		t.Errorf("DEL entry %s", mustJSON(t, e))
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	if out, err := (cniCall{command: "CHECK", containerID: "c1", netns: "/x", stdin: pluginConf(t, "/run/pr.sock", dir)}).run(t); err != nil || len(out) != 0 {
		t.Errorf("CHECK: %v, output %q", err, out)
	}
	out, err := cniCall{command: "CHECK", containerID: "c1", netns: "/x", stdin: []byte(`{"cniVersion":"1.0.0","name":"n","type":"pgmetacni","prevResult":` + prevResult + `}`)}.run(t)
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
	call := cniCall{containerID: "ctr1", netns: pod.Path, inNetns: host.Name, stdin: pluginConf(t, f.socket, dir)}

	call.command = "ADD"
	out, err := call.run(t)
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

	call.command = "CHECK"
	if out, err := call.run(t); err != nil || len(out) != 0 {
		t.Errorf("CHECK: %v, output %q", err, out)
	}

	// podgate forgot the pod: DEL works from the cache.
	f.set(nil, nil)
	call.command = "DEL"
	if out, err := call.run(t); err != nil || len(out) != 0 {
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
	if out, err := call.run(t); err != nil || len(out) != 0 {
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
	call.containerID, call.netns = "ctr2", filepath.Join("/run/netns", gone)
	call.command = "ADD"
	if _, err := call.run(t); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "del", gone).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v %s", err, out)
	}
	call.command = "DEL"
	if out, err := call.run(t); err != nil || len(out) != 0 {
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

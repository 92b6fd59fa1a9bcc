package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/cni/cnitest"
)

// pluginPath is the plugin binary built once by TestMain, as a runtime would find it in a CNI
// bin directory.
var pluginPath string

func TestMain(m *testing.M) { os.Exit(cnitest.Main(m, "pgmetacni", &pluginPath)) }

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

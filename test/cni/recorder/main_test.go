package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podgate/podgate/test/cni/cnitest"
	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/testnet"
)

// pluginPath is the recorder binary built once by TestMain, as containerd would find it in a CNI
// bin directory.
var pluginPath string

func TestMain(m *testing.M) { os.Exit(cnitest.Main(m, "pgrecorder", &pluginPath)) }

func TestVersion(t *testing.T) {
	out, err := cnitest.Call{Namespace: "ns1", Name: "pod1", Command: "VERSION"}.Run(t, pluginPath)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatalf("decode %s: %v", out, err)
	}
	if want := []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}; !reflect.DeepEqual(info.SupportedVersions, want) {
		t.Errorf("supportedVersions = %v, want %v", info.SupportedVersions, want)
	}
}

// TestAddWithoutRecordFile checks that a misconfigured recorder fails ADD loudly, with a CNI
// error object, rather than letting a test miss its observation. It records nothing, so it
// runs in the test's own namespace, without root; the netns path need not exist for that.
func TestAddWithoutRecordFile(t *testing.T) {
	out, err := cnitest.Call{Namespace: "ns1", Name: "pod1",
		Command: "ADD", ContainerID: "c0", Netns: "/nonexistent/netns",
		Stdin: []byte(`{"cniVersion":"1.0.0","name":"pgtest","type":"pgrecorder"}`),
	}.Run(t, pluginPath)
	if err == nil {
		t.Fatalf("ADD succeeded: %s", out)
	}
	var cniErr struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	}
	if jerr := json.Unmarshal(out, &cniErr); jerr != nil || !strings.Contains(cniErr.Msg, "recordFile is required") {
		t.Errorf("error output %s (%v), want a CNI error about recordFile", out, jerr)
	}
}

// TestAddRecordsFiles checks that ADD records the host files matching watchFiles, as a test
// reads a DRA driver's CDI spec file there, and fails on a malformed pattern. Like
// TestAddWithoutRecordFile it needs no root: the recorder does not enter CNI_NETNS.
func TestAddRecordsFiles(t *testing.T) {
	dir := t.TempDir()
	cdi := filepath.Join(dir, "cdi")
	if err := os.Mkdir(cdi, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(cdi, "k8s.net.example.com-net_uid-1.yaml")
	if err := os.WriteFile(spec, []byte("cdiVersion: 0.3.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	recordFile := filepath.Join(dir, "cni-record.jsonl")
	for _, tc := range []struct {
		name    string
		pattern string
		want    []string
		fails   bool
	}{
		{name: "present", pattern: filepath.Join(cdi, "*_uid-1.yaml"), want: []string{spec}},
		{name: "absent", pattern: filepath.Join(cdi, "*_uid-2.yaml")},
		{name: "malformed", pattern: filepath.Join(cdi, "["), fails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdin := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"pgtest","type":"pgrecorder","recordFile":%q,"watchFiles":[%q]}`, recordFile, tc.pattern)
			out, err := cnitest.Call{Namespace: "ns1", Name: "pod1", Command: "ADD", ContainerID: "c-" + tc.name,
				Netns: "/nonexistent/netns", Stdin: []byte(stdin)}.Run(t, pluginPath)
			if tc.fails {
				if err == nil || !strings.Contains(string(out), "watch files") {
					t.Errorf("ADD with pattern %q: %v, output %s; want a CNI error about watch files", tc.pattern, err, out)
				}
				return
			}
			if err != nil {
				t.Fatalf("ADD: %v, output %s", err, out)
			}
			add := lastEntry(t, recordFile)
			if add.ContainerID != "c-"+tc.name || !slices.Equal(add.Files, tc.want) {
				t.Errorf("ADD entry %+v, want files %q", add, tc.want)
			}
		})
	}
}

const prevResult100 = `{"cniVersion":"1.0.0",
 "interfaces":[{"name":"pgrig9","mac":"aa:bb:cc:00:00:01"},{"name":"veth1234","mac":"aa:bb:cc:00:00:02"},
               {"name":"eth0","mac":"aa:bb:cc:00:00:03","sandbox":"/run/netns/x"}],
 "ips":[{"interface":2,"address":"10.77.9.5/24","gateway":"10.77.9.1"}],
 "routes":[{"dst":"10.77.0.0/16"}]}`

const prevResult040 = `{"cniVersion":"0.4.0",
 "interfaces":[{"name":"pgrig9","mac":"aa:bb:cc:00:00:01"},{"name":"eth0","mac":"aa:bb:cc:00:00:03","sandbox":"/run/netns/x"}],
 "ips":[{"version":"4","interface":1,"address":"10.77.9.5/24","gateway":"10.77.9.1"}],
 "dns":{}}`

// TestAddDelCheck runs the plugin as containerd would on a host: inside a namespace the test
// made (the "host"), which holds a veth pair standing for a prepared DRA device, with CNI_NETNS a
// second namespace (the pod's).
func TestAddDelCheck(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and a veth pair")
	}
	host, hostLinks := newNetns(t)
	pod, _ := newNetns(t)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "pgrec0"}, PeerName: "pgrec0p"}
	if err := hostLinks.LinkAdd(veth); err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	recordFile := filepath.Join(t.TempDir(), "cni-record.jsonl")
	devInfo := filepath.Join(t.TempDir(), "devinfo", "cni", "net1.json")

	for i, tc := range []struct {
		name, cniVersion, prevResult string
		wantStdout                   string // "" = the prevResult
	}{
		{name: "chained 1.0.0", cniVersion: "1.0.0", prevResult: prevResult100},
		{name: "chained 0.4.0", cniVersion: "0.4.0", prevResult: prevResult040},
		{name: "first in chain", cniVersion: "1.0.0", wantStdout: `{"cniVersion":"1.0.0"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conf := map[string]any{
				"cniVersion": tc.cniVersion, "name": "pgtest", "type": "pgrecorder",
				"recordFile":      recordFile,
				"watchInterfaces": []string{"pgrec0", "pgrec1"},
				"watchPrefixes":   []string{"pgrec"},
				"deviceID":        "vf3", // as multus gives it to a delegate
				"runtimeConfig":   map[string]string{"CNIDeviceInfoFile": devInfo},
			}
			if tc.prevResult != "" {
				conf["prevResult"] = json.RawMessage(tc.prevResult)
			}
			stdin, err := json.Marshal(conf)
			if err != nil {
				t.Fatal(err)
			}
			call := cnitest.Call{Namespace: "ns1", Name: "pod1", ContainerID: fmt.Sprintf("ctr%d", i), Netns: filepath.Join("/run/netns", pod), InNetns: host, Stdin: stdin}

			before := time.Now()
			call.Command = "ADD"
			out, err := call.Run(t, pluginPath)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.wantStdout
			if want == "" {
				want = tc.prevResult
			}
			requireSameJSON(t, out, want)
			add := lastEntry(t, recordFile)
			if add.Command != "ADD" || add.ContainerID != call.ContainerID || add.Netns != call.Netns || add.IfName != "eth0" ||
				add.Pod != (record.Pod{Namespace: "ns1", Name: "pod1", UID: "uid-1"}) || add.Time.Before(before) || add.DeviceID != "vf3" {
				t.Errorf("ADD entry = %+v", add)
			}
			if b, err := os.ReadFile(devInfo); err != nil || string(b) != `{"type":"pci","version":"1.1.0","pci":{"pci-address":"vf3"}}` {
				t.Errorf("device information %s: %s, %v", devInfo, b, err)
			}
			wantIfaces := map[string]bool{"pgrec0": true, "pgrec0p": true, "pgrec1": false}
			if !maps.Equal(add.Interfaces, wantIfaces) {
				t.Errorf("ADD interfaces = %v, want %v", add.Interfaces, wantIfaces)
			}

			call.Command = "CHECK"
			if out, err := call.Run(t, pluginPath); err != nil || len(out) != 0 {
				t.Errorf("CHECK: %v, output %q", err, out)
			}

			call.Command = "DEL"
			if out, err := call.Run(t, pluginPath); err != nil || len(out) != 0 {
				t.Fatalf("DEL: %v, output %q", err, out)
			}
			if del := lastEntry(t, recordFile); del.Command != "DEL" || del.ContainerID != call.ContainerID || !del.Interfaces["pgrec0"] {
				t.Errorf("DEL entry = %+v", del)
			}
		})
	}
	entries, err := record.Read(recordFile)
	if err != nil {
		t.Fatal(err)
	}
	if adds := record.Find(entries, "ADD", "ns1", "pod1"); len(entries) != 6 || len(adds) != 3 {
		t.Errorf("record holds %d entries, %d ADDs; want 6 and 3", len(entries), len(adds))
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

func lastEntry(t *testing.T, path string) record.Entry {
	t.Helper()
	entries, err := record.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) == 0 {
		t.Fatal("record file is empty")
	}
	return entries[len(entries)-1]
}

// newNetns creates a named network namespace for the test and returns its name and a netlink
// handle inside it. Both go away when the test ends.
func newNetns(t *testing.T) (string, *netlink.Handle) {
	t.Helper()
	ns := testnet.New(t, "pgrec")
	return ns.Name, ns.Handle
}

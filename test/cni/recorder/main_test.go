package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/testnet"
)

// pluginPath is the recorder binary built once by TestMain, as containerd would find it in a CNI
// bin directory.
var pluginPath string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "pgrecorder")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		pluginPath = filepath.Join(dir, "pgrecorder")
		if out, err := exec.Command("go", "build", "-o", pluginPath, ".").CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
			return 1
		}
		return m.Run()
	}())
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
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=pod1;K8S_POD_INFRA_CONTAINER_ID=" + c.containerID + ";K8S_POD_UID=uid-1",
		"CNI_PATH=" + filepath.Dir(pluginPath),
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

func TestVersion(t *testing.T) {
	out, err := cniCall{command: "VERSION"}.run(t)
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
	out, err := cniCall{
		command: "ADD", containerID: "c0", netns: "/nonexistent/netns",
		stdin: []byte(`{"cniVersion":"1.0.0","name":"pgtest","type":"pgrecorder"}`),
	}.run(t)
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
			}
			if tc.prevResult != "" {
				conf["prevResult"] = json.RawMessage(tc.prevResult)
			}
			stdin, err := json.Marshal(conf)
			if err != nil {
				t.Fatal(err)
			}
			call := cniCall{containerID: fmt.Sprintf("ctr%d", i), netns: filepath.Join("/run/netns", pod), inNetns: host, stdin: stdin}

			before := time.Now()
			call.command = "ADD"
			out, err := call.run(t)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.wantStdout
			if want == "" {
				want = tc.prevResult
			}
			requireSameJSON(t, out, want)
			add := lastEntry(t, recordFile)
			if add.Command != "ADD" || add.ContainerID != call.containerID || add.Netns != call.netns || add.IfName != "eth0" ||
				add.Pod != (record.Pod{Namespace: "ns1", Name: "pod1", UID: "uid-1"}) || add.Time.Before(before) {
				t.Errorf("ADD entry = %+v", add)
			}
			wantIfaces := map[string]bool{"pgrec0": true, "pgrec0p": true, "pgrec1": false}
			if !maps.Equal(add.Interfaces, wantIfaces) {
				t.Errorf("ADD interfaces = %v, want %v", add.Interfaces, wantIfaces)
			}

			call.command = "CHECK"
			if out, err := call.run(t); err != nil || len(out) != 0 {
				t.Errorf("CHECK: %v, output %q", err, out)
			}

			call.command = "DEL"
			if out, err := call.run(t); err != nil || len(out) != 0 {
				t.Fatalf("DEL: %v, output %q", err, out)
			}
			if del := lastEntry(t, recordFile); del.Command != "DEL" || del.ContainerID != call.containerID || !del.Interfaces["pgrec0"] {
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

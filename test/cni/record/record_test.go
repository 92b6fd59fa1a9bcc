package record

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args string
		want Pod
	}{
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=ns1;K8S_POD_NAME=web-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
			Pod{Namespace: "ns1", Name: "web-0", UID: "u-1"}},
		{"K8S_POD_NAME=only", Pod{Name: "only"}},
		{"", Pod{}},
		{"garbage;K8S_POD_UID=", Pod{}},
	} {
		if got := ParseArgs(tc.args); got != tc.want {
			t.Errorf("ParseArgs(%q) = %+v, want %+v", tc.args, got, tc.want)
		}
	}
}

func TestParseConf(t *testing.T) {
	conf, err := ParseConf([]byte(`{"cniVersion":"1.0.0","name":"n","type":"pgrecorder",
		"recordFile":"/tmp/r.jsonl","watchInterfaces":["pgnic0"],"watchPrefixes":["pg"],"watchFiles":["/tmp/cdi/*"],"deviceID":"0000:af:00.1"}`))
	if err != nil {
		t.Fatal(err)
	}
	if conf.CNIVersion != "1.0.0" || conf.RecordFile != "/tmp/r.jsonl" ||
		fmt.Sprint(conf.WatchInterfaces, conf.WatchPrefixes, conf.WatchFiles) != "[pgnic0] [pg] [/tmp/cdi/*]" || conf.DeviceID != "0000:af:00.1" {
		t.Errorf("ParseConf = %+v", conf)
	}
	for _, bad := range []string{`{"name":"n"}`, `{`} {
		if _, err := ParseConf([]byte(bad)); err == nil {
			t.Errorf("ParseConf(%s) succeeded", bad)
		}
	}
}

// TestHostInterfaces looks at the test's own namespace, which always has lo.
func TestHostInterfaces(t *testing.T) {
	got, err := HostInterfaces([]string{"lo", "pgnone-x9"}, []string{"lo"})
	if err != nil {
		t.Fatal(err)
	}
	if !got["lo"] {
		t.Error("lo not found")
	}
	if present, watched := got["pgnone-x9"]; !watched || present {
		t.Errorf("pgnone-x9: present=%t watched=%t, want recorded as absent", present, watched)
	}
	for name, present := range got {
		if name != "pgnone-x9" && (!present || !strings.HasPrefix(name, "lo")) {
			t.Errorf("unexpected entry %s=%t", name, present)
		}
	}
}

func TestHostFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"k8s.net.example.com-net_common.yaml", "k8s.net.example.com-net_u1.yaml", "other.json"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		patterns []string
		want     []string
	}{
		{"none", nil, nil},
		{"no match", []string{filepath.Join(dir, "*.toml")}, nil},
		{"glob", []string{filepath.Join(dir, "*.yaml")}, []string{"k8s.net.example.com-net_common.yaml", "k8s.net.example.com-net_u1.yaml"}},
		{"overlapping, sorted once", []string{filepath.Join(dir, "*_u1.yaml"), filepath.Join(dir, "*")},
			[]string{"k8s.net.example.com-net_common.yaml", "k8s.net.example.com-net_u1.yaml", "other.json"}},
		{"missing directory", []string{filepath.Join(dir, "nope", "*")}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := HostFiles(tc.patterns)
			if err != nil {
				t.Fatal(err)
			}
			var want []string
			for _, f := range tc.want {
				want = append(want, filepath.Join(dir, f))
			}
			if !slices.Equal(got, want) {
				t.Errorf("HostFiles(%q) = %q, want %q", tc.patterns, got, want)
			}
		})
	}
	if _, err := HostFiles([]string{filepath.Join(dir, "[")}); err == nil {
		t.Error("HostFiles with a malformed pattern succeeded")
	}
}

// TestAppendConcurrent appends from many goroutines, as concurrent CNI calls would, and reads
// every line back intact.
func TestAppendConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "record.jsonl")
	const writers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				errs <- Append(path, Entry{
					Time: time.Now(), Command: "ADD", ContainerID: fmt.Sprintf("c%d-%d", w, i),
					Pod:        Pod{Namespace: "ns", Name: fmt.Sprintf("pod%d", w)},
					Interfaces: map[string]bool{"pgnic0": i%2 == 0},
				})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	entries, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != writers*each {
		t.Fatalf("read %d entries, want %d", len(entries), writers*each)
	}
	pod3 := Find(entries, "ADD", "ns", "pod3")
	if len(pod3) != each {
		t.Fatalf("Find pod3: %d entries, want %d", len(pod3), each)
	}
	seen := map[string]bool{}
	for _, e := range pod3 {
		seen[e.ContainerID] = true
	}
	if !seen["c3-0"] || !seen["c3-24"] || len(seen) != each {
		t.Errorf("pod3 container IDs: %v", seen)
	}
	if got := Find(entries, "DEL", "ns", "pod3"); len(got) != 0 {
		t.Errorf("Find DEL: %d entries, want 0", len(got))
	}
}

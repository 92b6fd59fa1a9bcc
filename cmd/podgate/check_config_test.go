package main

import (
	"bytes"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/podresources/cgroup"
)

// podgate check-config refuses, with exit status 1 and the key named, what would stop podgate at
// start-up though the file's values are well formed.
func TestCheckConfigResolvesStartUp(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(garbage, []byte("{this is: [not a kubeconfig\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	checkpoint := filepath.Join(stateDir, registry.CheckpointFile)
	if err := os.WriteFile(checkpoint, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	gid := ""
	for _, g := range []string{"2147483646", "987654321", "55555"} {
		if _, err := user.LookupGroupId(g); err != nil {
			gid = g
			break
		}
	}
	fresh := "stateDir: " + filepath.Join(dir, "fresh") + "\n"

	for _, tc := range []struct {
		name string
		body string
		code int
		want []string
	}{
		{name: "existing group", body: fresh + "criSocketGroup: root\n", code: 0, want: []string{": ok"}},
		{name: "existing gid", body: fresh + "criSocketGroup: \"0\"\n", code: 0, want: []string{": ok"}},
		{name: "unknown group", body: fresh + "criSocketGroup: podgate-no-such-group\n", code: 1,
			want: []string{`criSocketGroup: group "podgate-no-such-group": not found`}},
		{name: "unknown gid", body: fresh + "criSocketGroup: \"" + gid + "\"\n", code: 1,
			want: []string{`criSocketGroup: group "` + gid + `": not found`}},
		{name: "missing kubeconfig", body: fresh + "kubeconfig: " + filepath.Join(dir, "nonexistent") + "\n", code: 1,
			want: []string{"kubeconfig: ", "nonexistent"}},
		{name: "garbage kubeconfig", body: fresh + "kubeconfig: " + garbage + "\n", code: 1,
			want: []string{"kubeconfig: " + garbage}},
		{name: "damaged checkpoint", body: "stateDir: " + stateDir + "\n", code: 1,
			want: []string{"stateDir: ", checkpoint, "damaged"}},
		{name: "all at once", body: "stateDir: " + stateDir + "\nkubeconfig: " + garbage + "\ncriSocketGroup: podgate-no-such-group\n", code: 1,
			want: []string{"invalid:", "criSocketGroup: ", "kubeconfig: ", checkpoint}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if gid == "" && strings.Contains(tc.name, "gid") && tc.code != 0 {
				t.Skip("every candidate gid exists on this machine")
			}
			file := writeConfig(t, tc.body)
			var stdout, stderr bytes.Buffer
			code := run([]string{"check-config", file}, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != tc.code {
				t.Errorf("podgate check-config: exit %d, want %d; output:\n%s", code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("podgate check-config: output\n%s\nwant it to say %q", out, w)
				}
			}
		})
	}
}

// podgate check-config refuses bad imagePulls.coolDown and perRegistryRate values, each named
// with its key and reason.
func TestCheckConfigRefusesBadPullHolds(t *testing.T) {
	file := writeConfig(t, "stateDir: "+filepath.Join(t.TempDir(), "state")+"\nimagePulls:\n  coolDown: {initialDelay: 10ms, retryFor: -1s}\n  perRegistryRate: {\"a/b\": {pulls: 0, interval: 1s}}\n")
	var stdout, stderr bytes.Buffer
	code := run([]string{"check-config", file}, &stdout, &stderr)
	out := stdout.String() + stderr.String()
	if code != 1 {
		t.Errorf("podgate check-config: exit %d, want 1; output:\n%s", code, out)
	}
	for _, w := range []string{"imagePulls.coolDown.initialDelay: 10ms: must be at least 100ms", "imagePulls.coolDown.retryFor: -1s: must not be negative",
		`imagePulls.perRegistryRate["a/b"]: not a registry host`, `imagePulls.perRegistryRate["a/b"].pulls: must be positive, got 0`} {
		if !strings.Contains(out, w) {
			t.Errorf("podgate check-config: output\n%s\nwant it to say %q", out, w)
		}
	}
}

// podgate check-config says, after ok, what podgate would do beside the kubelet whose
// configuration file resources.kubeletConfig names: here a kubelet that writes memory QoS
// (its gate set), sets a default sysctl podgate sets otherwise, and pulls one image at a time.
func TestCheckConfigSaysKubeletDecisions(t *testing.T) {
	dir := t.TempDir()
	kubelet := filepath.Join(dir, "kubelet.yaml")
	if err := os.WriteFile(kubelet, []byte(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
featureGates:
  MemoryQoS: true
  DefaultPodSysctls: true
defaultPodSysctls:
  net.ipv4.tcp_keepalive_time: "120"
`), 0o600); err != nil {
		t.Fatal(err)
	}
	file := writeConfig(t, "stateDir: "+filepath.Join(dir, "state")+"\n"+
		"resources:\n  memoryQoS: true\n  kubeletConfig: "+kubelet+"\n"+
		"sysctls:\n  podDefaults:\n    net.ipv4.tcp_keepalive_time: \"600\"\n"+
		"imagePulls:\n  maxParallel: 4\n")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check-config", file}, &stdout, &stderr); code != 0 {
		t.Fatalf("podgate check-config: exit %d; output:\n%s%s", code, stdout.String(), stderr.String())
	}
	out := stdout.String()
	// The kubelet's memory QoS, and podgate's, need cgroup v2: the host decides.
	memoryQoS := `kubelet: Memory QoS: writer=none podgate=off reason="not cgroup v2`
	if cgroup.Detect().Mode == cgroup.ModeUnified {
		memoryQoS = `kubelet: Memory QoS: writer=kubelet podgate=verifies reason="featureGates.MemoryQoS: true in ` + kubelet + `, cgroup v2`
	}
	for _, w := range []string{
		file + ": ok\n",
		memoryQoS,
		"kubelet: Default sysctls: writer=kubelet+podgate",
		`kubelet: sysctl net.ipv4.tcp_keepalive_time: sysctls.podDefaults sets "600", the kubelet's defaultPodSysctls "120": the kubelet's value wins`,
		"kubelet: Image pull caps: writer=kubelet podgate=never queues",
		"never queue a pull: imagePulls.maxParallel (4)",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("podgate check-config: output\n%s\nwant it to say %q", out, w)
		}
	}
}

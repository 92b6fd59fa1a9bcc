package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFlagsOverrideTheFile(t *testing.T) {
	file := writeConfig(t, "criSocket: /run/file/cri.sock\nruntimeEndpoint: unix:///run/file/containerd.sock\nstateDir: /var/lib/file\n")
	var stderr bytes.Buffer
	cfg, err := configure([]string{"--config", file, "--cri-socket", "/run/flag/cri.sock", "--metrics-address", ""}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CRISocket != "/run/flag/cri.sock" {
		t.Errorf("criSocket %q, want the flag's", cfg.CRISocket)
	}
	// A flag not given leaves the file's value, even though the flag has a default.
	if cfg.RuntimeEndpoint != "unix:///run/file/containerd.sock" || cfg.StateDir != "/var/lib/file" {
		t.Errorf("file values lost: runtimeEndpoint %q stateDir %q", cfg.RuntimeEndpoint, cfg.StateDir)
	}
	if cfg.MetricsEnabled() {
		t.Error(`--metrics-address "" did not disable the listener`)
	}
}

func TestConfigureErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--runtime-endpoint", "tcp://x:1"}, "runtimeEndpoint:"},
		{[]string{"--config", "/nonexistent/podgate.yaml"}, "no such file"},
		{[]string{"--no-such-flag"}, "flag provided but not defined"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		var stderr bytes.Buffer
		_, err := configure(tc.args, &stderr)
		if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestCommands(t *testing.T) {
	good := writeConfig(t, "criSocket: /run/podgate/cri.sock\n")
	bad := writeConfig(t, "criSocket: /run/podgate/cri.sock\nstateDir: relative\nimagePullz: {}\n")
	misspelt := writeConfig(t, "stateDirr: /var/lib/podgate\n")
	for _, tc := range []struct {
		args       []string
		code       int
		wantOutput string
	}{
		{[]string{"version"}, 0, "podgate dev"},
		{[]string{"check-config", good}, 0, good + ": ok"},
		{[]string{"check-config", misspelt}, 1, `unknown field "stateDirr"`},
		{[]string{"check-config", bad}, 1, `imagePullz`},
		{[]string{"check-config"}, 2, "usage: podgate check-config FILE"},
		{[]string{"--state-dir", "relative"}, 2, "stateDir:"},
		{[]string{"-h"}, 0, "-cri-socket"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		out := stdout.String() + stderr.String()
		if code != tc.code || !strings.Contains(out, tc.wantOutput) {
			t.Errorf("podgate %v: exit %d, output %q; want exit %d and %q", tc.args, code, out, tc.code, tc.wantOutput)
		}
	}
}

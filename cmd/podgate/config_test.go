package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
)

// configDefaults runs `podgate config defaults` and returns what it prints.
func configDefaults(t *testing.T) []byte {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run([]string{"config", "defaults"}, &stdout, &stderr); code != 0 {
		t.Fatalf("podgate config defaults: exit %d; stderr:\n%s", code, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("podgate config defaults wrote to stderr:\n%s", stderr.String())
	}
	return stdout.Bytes()
}

// Every shipped or printed default configuration is one that podgate check-config accepts, and
// it is the configuration podgate runs with when no file is given.
func TestDefaultConfigFilesAreValidAndTheDefaults(t *testing.T) {
	printed := filepath.Join(t.TempDir(), "defaults.yaml")
	if err := os.WriteFile(printed, configDefaults(t), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, file := range []string{printed, filepath.Join("..", "..", "deploy", "config.yaml")} {
		var stdout, stderr bytes.Buffer
		if code := run([]string{"check-config", file}, &stdout, &stderr); code != 0 {
			t.Errorf("podgate check-config %s: exit %d; output:\n%s", file, code, stdout.String()+stderr.String())
			continue
		}
		cfg, err := config.LoadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if want := config.DefaultConfiguration(); !reflect.DeepEqual(cfg, want) {
			t.Errorf("%s is not the default configuration:\n got %+v\nwant %+v", file, cfg, want)
		}
	}
}

func TestConfigDefaultsUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"config", "defaults", "extra"}, &stdout, &stderr); code != 2 {
		t.Errorf("podgate config defaults extra: exit %d, want 2", code)
	}
	stdout.Reset()
	if code := run([]string{"--help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "config") {
		t.Errorf("podgate --help: exit %d, does not list config:\n%s", code, stdout.String())
	}
}

const (
	readmeDefaultsStart = "<!-- podgate config defaults -->\n```yaml\n"
	readmeDefaultsEnd   = "```\n<!-- end -->"
)

// docs/configuration.md (once the README's "Configuration" section) shows the defaults as
// `podgate config defaults` prints them, byte for byte.
func TestREADMEShowsTheDefaults(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), readmeDefaultsStart)
	if !ok {
		t.Fatalf("docs/configuration.md has no block starting %q", readmeDefaultsStart)
	}
	block, _, ok := strings.Cut(rest, readmeDefaultsEnd)
	if !ok {
		t.Fatalf("docs/configuration.md: the defaults block has no end %q", readmeDefaultsEnd)
	}
	if want := string(configDefaults(t)); block != want {
		t.Errorf("docs/configuration.md's defaults block is not the output of `podgate config defaults`.\n"+
			"Paste the output of `go run ./cmd/podgate config defaults` between the markers.\n"+
			"docs/configuration.md:\n%s\npodgate config defaults:\n%s", block, want)
	}
}

// systemd accepts deploy/podgate.service. systemd-analyze verify also checks that ExecStart's
// binary exists, so the test verifies a copy of the unit whose ExecStart is a podgate built here.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed: deploy/podgate.service not verified")
	}
	unit, err := os.ReadFile(filepath.Join("..", "..", "deploy", "podgate.service"))
	if err != nil {
		t.Fatal(err)
	}
	const execStart = "ExecStart=/usr/local/bin/podgate "
	if !strings.Contains(string(unit), "\n"+execStart) {
		t.Fatalf("deploy/podgate.service has no line starting %q", execStart)
	}
	for _, want := range []string{"\nAfter=network-online.target ", "\nWants=network-online.target "} {
		if !strings.Contains(string(unit), want) {
			t.Errorf("deploy/podgate.service lacks a line starting %q", strings.TrimPrefix(want, "\n"))
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "podgate")
	ctx := context.Background()
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	copied := filepath.Join(dir, "podgate.service")
	body := strings.Replace(string(unit), "\n"+execStart, "\nExecStart="+bin+" ", 1)
	if err := os.WriteFile(copied, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, analyze, "verify", copied).CombinedOutput()
	// verify exits 0 on warnings such as an unknown key: any word about the unit is a failure.
	if err != nil || strings.Contains(string(out), "podgate.service") {
		t.Errorf("systemd-analyze verify deploy/podgate.service (ExecStart=%s): %v\n%s", bin, err, out)
	}
}

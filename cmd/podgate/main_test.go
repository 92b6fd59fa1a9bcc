package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"+body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// configure parses args as podgate's command line and returns the configuration the agent would
// run with, without running it.
func configure(args []string, stderr io.Writer) (*config.Configuration, error) {
	var cfg *config.Configuration
	root := newCommand(io.Discard, stderr, func(c *config.Configuration) error {
		cfg = c
		return nil
	})
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		return nil, err
	}
	if cfg == nil {
		return nil, errors.New("the agent would not have run")
	}
	return cfg, nil
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
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"extra"}, `unknown command "extra" for "podgate"`},
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

func TestVerbosityFlag(t *testing.T) {
	for _, args := range [][]string{{"-v", "4"}, {"--v", "4"}, {"-v=4"}, {"--v=4"}} {
		cfg, err := configure(args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if cfg.Logging.Verbosity != 4 {
			t.Errorf("%v: verbosity %d, want 4", args, cfg.Logging.Verbosity)
		}
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name       string
		args       []string
		code       int
		want       []string // all in stdout+stderr
		wantStdout string   // when set, stdout must equal it
	}{
		{name: "help lists the commands", args: []string{"--help"}, code: 0,
			want: []string{"version", "check-config", "completion", "--config", "--cri-socket", "-v, --v", "--version"}},
		{name: "help command", args: []string{"help"}, code: 0, want: []string{"check-config", "completion"}},
		{name: "help of a command", args: []string{"help", "check-config"}, code: 0, want: []string{"podgate check-config FILE"}},
		// A test binary has no VCS stamp: the commit is unknown.
		{name: "version flag", args: []string{"--version"}, code: 0, wantStdout: "podgate dev\ncommit: unknown\ngo: " + runtime.Version() + "\n"},
		{name: "version command", args: []string{"version"}, code: 0, wantStdout: "podgate dev\ncommit: unknown\ngo: " + runtime.Version() + "\n"},
		{name: "check-config help", args: []string{"check-config", "--help"}, code: 0, want: []string{"podgate check-config FILE"}},
		{name: "check-config without file", args: []string{"check-config"}, code: 2, want: []string{"usage: podgate check-config FILE"}},
		{name: "check-config with two files", args: []string{"check-config", "a", "b"}, code: 2, want: []string{"got 2 arguments"}},
		{name: "unknown flag", args: []string{"--no-such-flag"}, code: 2, want: []string{"unknown flag: --no-such-flag", "podgate --help"}},
		{name: "unknown shorthand", args: []string{"-x"}, code: 2, want: []string{"-x"}},
		{name: "unknown command", args: []string{"chek-config"}, code: 2, want: []string{`unknown command "chek-config"`, "Did you mean this?"}},
		{name: "root flag on a command", args: []string{"check-config", "--cri-socket", "/x", "f"}, code: 2, want: []string{"unknown flag: --cri-socket"}},
		{name: "completion", args: []string{"completion", "bash"}, code: 0, want: []string{"bash completion"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			out := stdout.String() + stderr.String()
			if code != tc.code {
				t.Errorf("podgate %v: exit %d, want %d; output:\n%s", tc.args, code, tc.code, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("podgate %v: output lacks %q:\n%s", tc.args, w, out)
				}
			}
			if tc.wantStdout != "" && stdout.String() != tc.wantStdout {
				t.Errorf("podgate %v: stdout %q, want %q", tc.args, stdout.String(), tc.wantStdout)
			}
		})
	}
}

// check-config --help is help, not a file named --help: even when such a file exists.
func TestCheckConfigHelpOpensNoFile(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := os.WriteFile("--help", []byte("not: [yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run([]string{"check-config", "--help"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
	}
	if out := stdout.String() + stderr.String(); strings.Contains(out, "invalid") || strings.Contains(out, "--help: ok") {
		t.Errorf("check-config read the file --help:\n%s", out)
	}
	// The file itself can still be checked, after "--".
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"check-config", "--", "--help"}, &stdout, &stderr); code != 1 {
		t.Errorf("check-config -- --help: exit %d, want 1 (invalid file); output:\n%s", code, stdout.String()+stderr.String())
	}
}

func TestVersionFlagEqualsCommand(t *testing.T) {
	var flagOut, cmdOut bytes.Buffer
	if code := run([]string{"--version"}, &flagOut, io.Discard); code != 0 {
		t.Fatalf("--version: exit %d", code)
	}
	if code := run([]string{"version"}, &cmdOut, io.Discard); code != 0 {
		t.Fatalf("version: exit %d", code)
	}
	if flagOut.String() != cmdOut.String() {
		t.Errorf("--version printed %q, version printed %q", flagOut.String(), cmdOut.String())
	}
}

func TestExitStatusOfTheAgent(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code int
	}{
		{"runs and stops", nil, 0},
		{"runtime failure", &exitError{code: 1}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			root := newCommand(io.Discard, io.Discard, func(*config.Configuration) error {
				ran = true
				return tc.err
			})
			// nil args are no arguments, not os.Args (the test binary's flags).
			if code := execute(root, nil, io.Discard); code != tc.code || !ran {
				t.Errorf("exit %d, agent ran %v; want exit %d, ran", code, ran, tc.code)
			}
		})
	}
}

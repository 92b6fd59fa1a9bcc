// Package cnitest runs a CNI plugin the way a container runtime does, for the tests of
// podgate's test plugins (test/cni/recorder, test/cni/metacni).
package cnitest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Main builds the plugin of the test's package (the current directory) as name into a
// temporary directory, sets *path to it, runs the tests and returns their exit code, for a
// TestMain.
func Main(m *testing.M, name string, path *string) int {
	dir, err := os.MkdirTemp("", name)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	*path = filepath.Join(dir, name)
	if out, err := exec.Command("go", "build", "-o", *path, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// Call is one plugin invocation, with the environment containerd sets.
type Call struct {
	Command, ContainerID, Netns string
	// InNetns runs the plugin inside this named network namespace ("" = here).
	InNetns string
	// Namespace and Name are the pod's, in CNI_ARGS.
	Namespace, Name string
	// CNIPath is searched for delegated plugins after the plugin's own directory.
	CNIPath []string
	Stdin   []byte
}

// Run invokes plugin and returns its stdout; a non-zero exit is an error carrying stdout,
// where CNI plugins print their error object.
func (c Call) Run(t testing.TB, plugin string) ([]byte, error) {
	t.Helper()
	argv := []string{plugin}
	if c.InNetns != "" {
		argv = append([]string{"ip", "netns", "exec", c.InNetns}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = []string{
		"CNI_COMMAND=" + c.Command,
		"CNI_CONTAINERID=" + c.ContainerID,
		"CNI_NETNS=" + c.Netns,
		"CNI_IFNAME=eth0",
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=" + c.Namespace + ";K8S_POD_NAME=" + c.Name +
			";K8S_POD_INFRA_CONTAINER_ID=" + c.ContainerID + ";K8S_POD_UID=uid-1",
		"CNI_PATH=" + strings.Join(append([]string{filepath.Dir(plugin)}, c.CNIPath...), ":"),
		"PATH=" + os.Getenv("PATH"),
	}
	cmd.Stdin = bytes.NewReader(c.Stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%s %s: %w: stdout %s stderr %s", c.Command, strings.Join(argv, " "), err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

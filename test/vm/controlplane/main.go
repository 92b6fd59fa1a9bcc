//go:build linux

// Command controlplane runs the VM lane's Kubernetes control plane (etcd and kube-apiserver of
// test/cluster, on loopback) on the host around one command, the VM's run (test/vm/run.sh):
//
//	controlplane -dir DIR -- COMMAND [ARG...]
//
// It starts the control plane without a kubelet (the kubelet runs in the VM, node name
// podgate-vm), writes the admin kubeconfig to DIR/kubeconfig, runs COMMAND with
// VM_APISERVER_PORT (kube-apiserver's port on 127.0.0.1, which run.sh forwards into the guest)
// and VM_KUBECONFIG in its environment, then stops the control plane and exits with COMMAND's
// status. SIGINT and SIGTERM stop COMMAND and the control plane.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/podgate/podgate/test/cluster"
)

// downTimeout bounds the control plane's stop: no kubelet is left to drain pods (the VM is
// off), so the drain's wait is cut short by it.
const downTimeout = 90 * time.Second

func main() {
	dir := flag.String("dir", "", "the control plane's directory (certificates, etcd's data, logs); kept")
	flag.Parse()
	if *dir == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: controlplane -dir DIR -- COMMAND [ARG...]")
		os.Exit(2)
	}
	code, err := run(*dir, flag.Args())
	if err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// run starts the control plane, runs the command and stops the control plane; it returns the
// command's exit status.
func run(dir string, command []string) (int, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := cluster.Up(ctx, cluster.Options{DeferKubelet: true, NodeName: "podgate-vm", Dir: dir})
	if err != nil {
		return 1, fmt.Errorf("start: %w", err)
	}
	code, runErr := runCommand(ctx, c, command)
	dctx, cancel := context.WithTimeout(context.Background(), downTimeout)
	defer cancel()
	return code, errors.Join(runErr, c.Down(dctx))
}

// runCommand runs the command with the API server's port and kubeconfig in its environment.
func runCommand(ctx context.Context, c *cluster.Cluster, command []string) (int, error) {
	u, err := url.Parse(c.RESTConfig().Host)
	if err != nil {
		return 1, fmt.Errorf("API server address: %w", err)
	}
	cmd := exec.CommandContext(ctx, command[0], command[1:]...)
	cmd.Env = append(os.Environ(), "VM_APISERVER_PORT="+u.Port(), "VM_KUBECONFIG="+c.Kubeconfig())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	err = cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode(), nil
	}
	if err != nil {
		return 1, fmt.Errorf("run %s: %w", command[0], err)
	}
	return 0, nil
}

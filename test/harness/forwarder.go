package harness

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
)

// Forwarder is test/forwarder, the minimal raw-codec gRPC forwarder, running in front of a
// runtime: the baseline a proxy's cost is measured against.
type Forwarder struct {
	cmd *exec.Cmd
	// Endpoint is unix://path of its socket.
	Endpoint string
	// PprofURL is http://host:port of its profiles, when started with them.
	PprofURL string
}

// StartForwarder builds test/forwarder (static, as podgate) into dir and starts it in front of
// the runtime at endpoint (unix://path); it returns once the forwarder says it is ready. Stop
// it with Stop.
func StartForwarder(ctx context.Context, dir, endpoint string, pprof bool) (*Forwarder, error) {
	var args []string
	if pprof {
		args = append(args, "-pprof", "127.0.0.1:0")
	}
	return startForwarder(ctx, dir, endpoint, "fwd.sock", args...)
}

// StartByteRelay is StartForwarder with test/forwarder -bytes: a relay that copies each
// connection's bytes without looking at them, the floor of any relay.
func StartByteRelay(ctx context.Context, dir, endpoint string) (*Forwarder, error) {
	return startForwarder(ctx, dir, endpoint, "bytes.sock", "-bytes")
}

func startForwarder(ctx context.Context, dir, endpoint, name string, extra ...string) (*Forwarder, error) {
	root, err := moduleRoot()
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "forwarder")
	if err := goBuild(ctx, root, true, []string{"build", "-o", bin, "./test/forwarder"}); err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, name)
	args := append([]string{"-listen", sock, "-backend", strings.TrimPrefix(endpoint, "unix://")}, extra...)
	f := &Forwarder{cmd: exec.Command(bin, args...), Endpoint: "unix://" + sock}
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := f.cmd.Start(); err != nil {
		return nil, err
	}
	r := bufio.NewReader(out)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			f.Stop()
			return nil, fmt.Errorf("forwarder did not start: %q %w", line, err)
		}
		if addr, ok := strings.CutPrefix(strings.TrimSpace(line), "pprof "); ok {
			f.PprofURL = "http://" + addr
			continue
		}
		if strings.TrimSpace(line) != "ready" {
			f.Stop()
			return nil, fmt.Errorf("forwarder did not start: %q", line)
		}
		return f, nil
	}
}

// PID is the forwarder's process id.
func (f *Forwarder) PID() int { return f.cmd.Process.Pid }

// Stop kills the forwarder and waits for it.
func (f *Forwarder) Stop() {
	_ = f.cmd.Process.Kill()
	_ = f.cmd.Wait()
}

//go:build linux

package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// errKilled means a process did not exit on SIGTERM in time and was killed.
var errKilled = errors.New("did not exit on SIGTERM and was killed")

// process is one daemon of the cluster (etcd, kube-apiserver or kubelet), with its output
// appended to a log file.
type process struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{} // closed when the process has exited and err is set
	err     error
}

// startProcess starts bin with args, its stdout and stderr appended to logPath.
func startProcess(name, logPath, bin string, args ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	// The child holds its own descriptor; ours is only needed until the fork.
	defer logFile.Close()
	// A restart appends to the same file: mark where each run begins.
	fmt.Fprintf(logFile, "==== %s: %s %s\n", time.Now().Format(time.RFC3339Nano), bin, strings.Join(args, " "))

	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Its own process group: stop signals whatever helpers it runs, too.
		Setpgid: true,
		// A test binary that dies (panic, timeout, kill) before its cleanups run must not leave
		// daemons behind: the kernel kills them with it.
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has exited, and how.
func (p *process) exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM to the process group, and SIGKILL after grace; it returns when the process
// has exited. An exit caused by SIGTERM is no error; one by SIGKILL is errKilled.
func (p *process) stop(grace time.Duration) error {
	if done, _ := p.exited(); done {
		return nil
	}
	pgid := p.cmd.Process.Pid
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stop %s: %w", p.name, err)
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		return nil
	case <-timer.C:
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	// SIGKILL cannot be ignored; only a process stuck in the kernel (D state) takes longer.
	select {
	case <-p.done:
		return fmt.Errorf("%s %w after %s; last lines of %s:\n%s", p.name, errKilled, grace, p.logPath, logTail(p.logPath, 20))
	case <-time.After(30 * time.Second):
		return fmt.Errorf("%s (pid %d) does not die", p.name, pgid)
	}
}

// logTail returns the last n lines of a log file, for failure messages.
func logTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// exitError describes a process that exited while it should be running, with its log's tail.
func (p *process) exitError(err error) error {
	return fmt.Errorf("%s exited: %w\nlast lines of %s:\n%s", p.name, err, p.logPath, logTail(p.logPath, 30))
}

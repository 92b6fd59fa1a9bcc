package main

import (
	"bufio"
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/harness"
)

func main() {
	h2spec := flag.String("h2spec", "", "run this h2spec binary against podgate and grpc-go instead of the attacks")
	path := flag.String("path", "/runtime.v1.RuntimeService/Version", "the path h2spec's requests take")
	silence := flag.Duration("silence", 30*time.Second, "how long the silent connections stay silent")
	stressFor := flag.Duration("stress", time.Minute, "how long the write path's stress test runs")
	only := flag.String("only", "", "run only the attacks whose name contains this")
	flood := flag.String("flood", "", "internal: flood this PodResources socket with List calls")
	podgate := flag.String("podgate", "", "attack this podgate binary (an older build, say) instead of one built from ./cmd/podgate")
	flag.Parse()
	if *flood != "" {
		os.Exit(floodPodResources(*flood))
	}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "hostile")
	if err != nil {
		fail(err)
	}
	defer os.RemoveAll(dir)
	bins, err := harness.BuildPrograms(ctx, filepath.Join(dir, "bin"), "./test/e2e/fakeruntime")
	if err != nil {
		fail(err)
	}
	env := &rig{dir: dir, podgate: cmp.Or(*podgate, bins["podgate"]), fake: bins["fakeruntime"]}
	if *h2spec != "" {
		if err := runH2spec(ctx, env, *h2spec, *path, flag.Args()); err != nil {
			fail(err)
		}
		return
	}
	runAttacks(ctx, env, *silence, *stressFor, *only)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "hostile:", err)
	os.Exit(1)
}

// rig starts the processes attacked: the fake runtime (grpc-go) and podgate in front of it.
type rig struct {
	dir, podgate, fake string
	n                  int
}

// fakeRuntime is test/e2e/fakeruntime running.
type fakeRuntime struct {
	cmd  *exec.Cmd
	sock string
}

func (r *rig) startFake(args ...string) (*fakeRuntime, error) {
	r.n++
	d := filepath.Join(r.dir, strconv.Itoa(r.n))
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	f := &fakeRuntime{sock: filepath.Join(d, "fake.sock")}
	f.cmd = exec.Command(r.fake, append([]string{"-listen", f.sock, "-containers", "10", "-sandboxes", "10"}, args...)...)
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	f.cmd.Stderr = os.Stderr
	if err := f.cmd.Start(); err != nil {
		return nil, err
	}
	if line, _ := bufio.NewReader(out).ReadString('\n'); strings.TrimSpace(line) != "ready" {
		f.stop()
		return nil, fmt.Errorf("fake runtime did not start: %q", line)
	}
	return f, nil
}

func (f *fakeRuntime) stop() {
	_ = f.cmd.Process.Kill()
	_ = f.cmd.Wait()
}

// startPodgate starts podgate in front of f, with config (YAML keys of podgate's
// configuration file) when set.
func (r *rig) startPodgate(ctx context.Context, f *fakeRuntime, config string) (*harness.Podgate, error) {
	d := filepath.Join(r.dir, strconv.Itoa(r.n), "pg")
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	args := []string{"-v", "2"}
	if config != "" {
		file := filepath.Join(d, "config.yaml")
		if err := os.WriteFile(file, []byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"+config), 0o600); err != nil {
			return nil, err
		}
		args = append(args, "--config", file)
	}
	return harness.Start(ctx, r.podgate, harness.Options{Dir: d, RuntimeEndpoint: "unix://" + f.sock, Args: args})
}

// memory is a process's VmRSS and VmHWM in MB.
type memory struct{ rss, hwm float64 }

func readMemory(pid int) memory {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return memory{-1, -1}
	}
	var m memory
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch k {
		case "VmRSS":
			m.rss = kb / 1000
		case "VmHWM":
			m.hwm = kb / 1000
		}
	}
	return m
}

// kubeletDeadline is the deadline of the kubelet-shaped client's Version calls. The real
// kubelet gives a CRI call runtimeRequestTimeout (2 min); 10 s is far below it and far above
// what a call takes when the machine is busy with other tests (make test runs packages side by
// side, podgate built with -race), so a call not answered within it is podgate's fault, not the
// machine's. How long the answers took is reported beside the count.
const kubeletDeadline = 10 * time.Second

// kubelet calls Version on a CRI socket every 100 ms, as a kubelet's probe does, and counts
// the calls answered, the slowest answer and the first error.
type kubelet struct {
	answered, calls atomic.Int64
	mu              sync.Mutex
	slowest         time.Duration
	failed          error // the first call that failed, with its code and message
	stop            chan struct{}
	done            sync.WaitGroup
}

func startKubelet(sock string) (*kubelet, error) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	k := &kubelet{stop: make(chan struct{})}
	client := runtimeapi.NewRuntimeServiceClient(conn)
	k.done.Go(func() {
		defer conn.Close()
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-k.stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), kubeletDeadline)
			start := time.Now()
			_, err := client.Version(ctx, &runtimeapi.VersionRequest{})
			took := time.Since(start)
			cancel()
			k.mu.Lock()
			if err == nil {
				k.slowest = max(k.slowest, took)
			} else if k.failed == nil {
				k.failed = fmt.Errorf("call %d failed after %s: %w", k.calls.Load()+1, took.Round(time.Millisecond), err)
			}
			k.mu.Unlock()
			k.calls.Add(1)
			if err == nil {
				k.answered.Add(1)
			}
		}
	})
	return k, nil
}

// probed is what the kubelet-shaped client saw: the calls it made, those answered, its slowest
// answer and its first call that failed.
type probed struct {
	answered, calls int64
	slowest         time.Duration
	failed          error
}

// finish stops the client and returns what it saw.
func (k *kubelet) finish() probed {
	close(k.stop)
	k.done.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	return probed{answered: k.answered.Load(), calls: k.calls.Load(), slowest: k.slowest, failed: k.failed}
}

// readCPU is the CPU time a process has used, user and system.
func readCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// After the command's name in parentheses: state is field 3, utime 14, stime 15.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

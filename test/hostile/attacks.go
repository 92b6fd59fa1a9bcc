package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/podgate/podgate/test/harness"
)

const updatePath = "/runtime.v1.RuntimeService/UpdateContainerResources"

// attack is one misbehaving client. run attacks the socket and returns what the server did,
// and a cleanup that ends the attack's connections; the RSS is read between the two.
type attack struct {
	name string
	// podResources: the attack is on podgate's PodResources socket (no grpc-go anchor).
	podResources bool
	// fake holds more arguments of the fake runtime (a larger one).
	fake []string
	// config holds keys of podgate's configuration file the attack runs with, when it does
	// not run with the defaults.
	config string
	// frames, when set, is how many frames the attack sends: the table gives the server's CPU
	// per frame.
	frames int
	run    func(ctx context.Context, sock string) (string, func())
	// on, set instead of run, attacks a server it is told more of: which, its pid, its metrics.
	on func(ctx context.Context, t target) (string, func())
	// check, when set, says what podgate did that it must not have, beside what every attack
	// checks (TestAttacks); nil when it held.
	check func(o outcome) error
	// anchored: check compares podgate with the grpc-go server, which TestAttacks then attacks
	// too, first.
	anchored bool
	// offends: podgate refuses the attacker, and its log must name the attacking process.
	offends bool
}

// target is the server an attack's on function attacks.
type target struct {
	server string // "podgate" or "grpc-go"
	sock   string
	pid    int
	pg     *harness.Podgate // nil for grpc-go
}

// attacks are every row: silence is how long the silent connections stay silent, stressFor how
// long the write path's stress test runs.
func attacks(silence, stressFor time.Duration) []attack {
	rows := []attack{
		{name: "40 UpdateContainerResources requests of 16 MiB, never ended", offends: true, run: func(ctx context.Context, sock string) (string, func()) {
			return bodies(ctx, sock, 40, 16<<20, 16<<20, nil)
		}},
		{name: "8 streams, prefix 0xFFFFFFFF, 16 MiB sent each, never ended", offends: true, run: func(ctx context.Context, sock string) (string, func()) {
			return bodies(ctx, sock, 8, 0xFFFFFFFF, 16<<20, nil)
		}},
		{name: "grpc-timeout 1S, request never ended", offends: true, run: timeout},
		{name: "HPACK: 4,000-byte -bin entry × 255 per stream, 1,000 streams (UpdateContainerResources)", offends: true, run: func(ctx context.Context, sock string) (string, func()) {
			return hpackBomb(ctx, sock, updatePath)
		}},
		{name: "HPACK: the same on PodResources (List)", podResources: true, run: func(ctx context.Context, sock string) (string, func()) {
			return hpackBomb(ctx, sock, "/v1.PodResourcesLister/List")
		}},
		{name: fmt.Sprintf("500 connections: preface, then silence %s", silence), run: func(ctx context.Context, sock string) (string, func()) {
			return silent(ctx, sock, 500, silence)
		}},
		{name: fmt.Sprintf("500 connections on PodResources: preface, then silence %s", silence), podResources: true, run: func(ctx context.Context, sock string) (string, func()) {
			return silent(ctx, sock, 500, silence)
		}},
		{name: "PodResources: one process calls List 3,000 times, then another 20 times", podResources: true, run: floodFairness},
		{name: "PodResources: one process opens 64 connections (half-open, idle, Watch) for 15 s; another calls List and Watch 10 times each", podResources: true, run: holdAttack},
		{name: "PodResources: 30 forked processes of one user call List for 3 s", podResources: true, run: forkAttack},
		{name: "4 CreateContainer requests of 15 MiB (7.8 M empty config.envs) on one connection", offends: true, run: func(ctx context.Context, sock string) (string, func()) {
			return emptyEnvs(ctx, sock, 4, 15<<20)
		}},
		{name: "8 connections × 4 UpdateContainerResources requests of 15 MiB, never ended", offends: true, run: func(ctx context.Context, sock string) (string, func()) {
			return budgets(ctx, sock, 8, 4, 15<<20)
		}},
	}
	rows = append(rows, writeAttacks()...)
	return append(rows, faultAttacks(stressFor)...)
}

// writeAttacks are issue 38's attacks on the CRI socket's write path, with default limits.
func writeAttacks() []attack {
	deaf := new(deafStats)
	// The keepalive closes a connection whose calls podgate has nothing to write for (its
	// ListContainers refused over the budget) and writeTimeout (20 s) one podgate cannot write
	// to; and room for the close to be seen.
	deafWait := 30 * time.Second
	return []attack{
		{
			name:    "8 connections: 60 MiB of unfinished intercepted bodies each, then ListContainers (21 MB) with huge windows, then never read (keepalive 5 s + 5 s)",
			fake:    []string{"-containers", bigRuntime, "-lists-once"},
			config:  "criSocketLimits:\n  keepaliveTime: 5s\n  keepaliveTimeout: 5s\n",
			offends: true,
			run: func(ctx context.Context, sock string) (string, func()) {
				return deafAfterBodies(ctx, sock, 8, deafWait, deaf)
			},
			check: func(outcome) error {
				if deaf.closed < deaf.conns {
					return fmt.Errorf("%d of %d connections that stopped reading still open after %s", deaf.conns-deaf.closed, deaf.conns, deafWait)
				}
				return nil
			},
		},
		{
			name:    "10 connections × 16 ListContainers (21 MB), reading but never sending WINDOW_UPDATE",
			fake:    []string{"-containers", bigRuntime, "-lists-once"},
			offends: true,
			run: func(ctx context.Context, sock string) (string, func()) {
				return noWindow(ctx, sock, 10, 16, 10*time.Second)
			},
		},
		{
			name: "one connection, 999 calls open, 20,000 WINDOW_UPDATE frames", frames: 20000,
			run: func(ctx context.Context, sock string) (string, func()) {
				return controlFrames(ctx, sock, "window_update", 20000)
			},
		},
		{
			name: "one connection, 999 calls open, 20,000 SETTINGS frames", frames: 20000,
			run: func(ctx context.Context, sock string) (string, func()) {
				return controlFrames(ctx, sock, "settings", 20000)
			},
		},
		{
			name: "8 connections × 999 UpdateContainerResources calls whose request never comes",
			run: func(ctx context.Context, sock string) (string, func()) {
				return headerOnly(ctx, sock, 8, 999)
			},
		},
	}
}

// summary says how the server ended the attack's streams.
func summary(counts map[string]int) string {
	if len(counts) == 0 {
		return "no stream ended"
	}
	var parts []string
	for how, n := range counts {
		parts = append(parts, fmt.Sprintf("%d %s", n, how))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// bodies opens n streams of UpdateContainerResources on one connection, each a message whose
// prefix says prefix bytes, and sends size bytes on each as far as the server's windows let
// it, never ending them.
func bodies(ctx context.Context, sock string, n int, prefix uint32, size int, more []string) (string, func()) {
	h, err := dialH2(ctx, sock)
	if err != nil {
		return "dial: " + err.Error(), func() {}
	}
	body := make([]byte, size)
	body[0] = 0
	binary.BigEndian.PutUint32(body[1:5], prefix)
	var sent int
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		id := uint32(2*i + 1)
		if err := h.open(id, grpcBlock(updatePath, more...), false); err != nil {
			break
		}
		got, _ := h.send(id, body, 2*time.Second)
		sent += got
	}
	return fmt.Sprintf("%d MiB taken; %s", sent>>20, summary(h.endings())), h.close
}

// timeout sends a request with grpc-timeout 1S and a part of its body, and waits 10 s for the
// server to end it.
func timeout(ctx context.Context, sock string) (string, func()) {
	h, err := dialH2(ctx, sock)
	if err != nil {
		return "dial: " + err.Error(), func() {}
	}
	start := time.Now()
	if err := h.open(1, grpcBlock(updatePath, "grpc-timeout", "1S"), false); err != nil {
		return "open: " + err.Error(), h.close
	}
	body := make([]byte, 1000)
	binary.BigEndian.PutUint32(body[1:5], 4000)
	_, _ = h.send(1, body, 2*time.Second)
	how, at := h.waitEnd(1, 10*time.Second)
	if how == "" {
		return "nothing within 10 s", h.close
	}
	return fmt.Sprintf("%s after %.1f s", how, at.Sub(start).Seconds()), h.close
}

// hpackBomb puts one 4,000-byte -bin entry in the dynamic table and opens 1,000 streams whose
// header blocks refer to it 255 times each (1 byte a reference, 1 MB decoded).
func hpackBomb(ctx context.Context, sock, path string) (string, func()) {
	h, err := dialH2(ctx, sock)
	if err != nil {
		return "dial: " + err.Error(), func() {}
	}
	value := strings.Repeat("A", 4000)
	sentBytes := 0
	for i := range 1000 {
		if ctx.Err() != nil || h.isClosed() {
			break
		}
		b := grpcBlock(path)
		refs := 255
		if i == 0 {
			b = literal(b, 0x40, "x-a-bin", value) // into the dynamic table, index 62
			refs--
		}
		for range refs {
			b = append(b, 0x80|62)
		}
		if err := h.open(uint32(2*i+1), b, false); err != nil {
			break
		}
		sentBytes += len(b)
	}
	// Let the server decode what it was sent.
	h.waitEnd(2*1000-1, 3*time.Second)
	closed := ""
	if h.isClosed() {
		closed = "; connection closed"
	}
	return fmt.Sprintf("%d KB sent; %s%s", sentBytes/1000, summary(h.endings()), closed), h.close
}

// silent opens n connections that say the preface and SETTINGS and then nothing, and counts
// those the server closed within d.
func silent(ctx context.Context, sock string, n int, d time.Duration) (string, func()) {
	var conns []*h2conn
	refused := 0 // closed before the preface was written
	for range n {
		h, err := dialH2(ctx, sock)
		if err != nil {
			refused++
			continue
		}
		conns = append(conns, h)
	}
	time.Sleep(d)
	closed := refused
	for _, h := range conns {
		if h.isClosed() {
			closed++
		}
	}
	return fmt.Sprintf("%d of %d closed within %s (%d before the preface)", closed, n, d, refused), func() {
		for _, h := range conns {
			h.close()
		}
	}
}

// floodFairness runs this program again as a process that calls List 3,000 times as fast as
// it can, then calls List 20 times itself: a rate limit per client serves those.
func floodFairness(ctx context.Context, sock string) (string, func()) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-flood", sock)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "flooder: " + err.Error(), func() {}
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err.Error(), func() {}
	}
	defer conn.Close()
	ok := 0
	for range 20 {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := podresourcesv1.NewPodResourcesListerClient(conn).List(cctx, &podresourcesv1.ListPodResourcesRequest{})
		cancel()
		if err == nil {
			ok++
		}
	}
	return fmt.Sprintf("flooder: %s; the other client: %d/20 answered", strings.TrimSpace(string(out)), ok), func() {}
}

// floodPodResources is the flooding process: 3,000 List calls on sock, each counted by its
// code.
func floodPodResources(sock string) int {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	var mu sync.Mutex
	counts := map[codes.Code]int{}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 300 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
				cancel()
				mu.Lock()
				counts[status.Code(err)]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	fmt.Printf("%d answered, %d ResourceExhausted, %d other\n", counts[codes.OK], counts[codes.ResourceExhausted], 3000-counts[codes.OK]-counts[codes.ResourceExhausted])
	return 0
}

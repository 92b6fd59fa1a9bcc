// Command hostile runs the attacks of issues 30, 38 and 47 (local clients that misbehave at the
// HTTP/2 level or above, or meet a fault of podgate's) against podgate, built from ./cmd/podgate
// and run in front of test/e2e/fakeruntime, and against that grpc-go server directly, and
// prints a table: each attack's RSS before and after (VmRSS, VmHWM of the process attacked),
// what the attacked server did, whether a kubelet-shaped client calling Version every 100 ms
// (10 s deadline) was answered throughout and its slowest answer, podgate's refusal log lines, the attacked process's CPU time (per
// frame for the control-frame rows), what podgate's budget held at the attack's end, and
// whether podgate held what TestAttacks checks of the attack. Every attack is bounded in
// streams, bytes and time; each runs against fresh processes. Issue 38's rows: clients that
// stop reading or open no window (writer.go), requests whose decoded size is many times their
// bytes (decode.go), and PodResources slots (prquota.go: other processes, this program run
// again, one holding 64 connections beside another's calls, 30 flooding List).
//
// Issue 47's rows are the faults of podgate's outgoing side, each a client that meets one
// (faults.go): F1, a grpc-go client with static 1 GiB windows, which sends nothing while it
// reads, gets its large lists; F2, a kubelet-like client beside another process's ~250
// connections whose parked answers fill the budget keeps its one connection and its lists
// (park.go); F3, Version beside a slowly read 21 MB answer on the same connection waits no
// longer than twice what it waits on grpc-go, and a kubelet-like client's Versions are all
// answered; F4, 1,000-odd connections that never read, flooding PINGs or calls refused quoting
// a 60 KB path, cost no more than 384 MiB, and quoting costs no more CPU than reading what is
// quoted (flood.go). F5, a write deadline left on a connection, is cri/relay's
// TestNoWriteDeadlineLeftAfterASlowWrite. Beside them, the stress test of the write path
// (stress.go, against fakeruntime -stress): many calls at once from clients that read in small
// chunks, pause, use small windows, reset, let deadlines cut and break their connections off,
// every answer, its header and trailer metadata checked byte for byte.
//
// TestAttacks (go test ./test/hostile, as root) runs every attack against podgate with its
// default limits and checks what each must hold: peak RSS within 384 MiB, the kubelet's Version
// answered throughout, a log line naming the attacking process where podgate refused it, and
// the attack's own check (every connection that stopped reading closed; issue 47's asserts;
// no answer of the stress test that differs by a byte). A row whose check compares podgate
// with grpc-go (F3's latency) attacks the grpc-go server too, first, in the same run.
//
//	go run ./test/hostile                          # make attacks
//	go run ./test/hostile -podgate BIN -only TEXT  # a given build (the before of a change), some rows
//	go run ./test/hostile -only stress -stress 5m  # the stress test alone, longer (1 minute by default)
//
// With -h2spec BIN it runs h2spec (patched to send gRPC-shaped requests, see test/h2spec)
// against podgate's CRI socket, against the grpc-go server, and against the grpc-go server
// advertising podgate's stream limit, each through a TCP→unix forwarder, and prints each test's
// result side by side (make h2spec). Arguments after the flags are h2spec's test IDs:
//
//	go run ./test/hostile -h2spec BIN http2/5.1.2
//
// It needs root: podgate runs as root.
package main

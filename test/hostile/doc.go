// Command hostile runs the attacks of issues 30 and 38 (local clients that misbehave at the
// HTTP/2 level or above) against podgate, built from ./cmd/podgate and run in front of
// test/e2e/fakeruntime, and against that grpc-go server directly, and prints a table: each
// attack's RSS before and after (VmRSS, VmHWM of the process attacked), what the attacked server
// did, whether a kubelet-shaped client calling Version every 100 ms was answered throughout,
// podgate's refusal log lines, the attacked process's CPU time (per frame for the control-frame
// rows) and what podgate's budget held at the attack's end. Every attack is bounded in streams,
// bytes and time; each runs against fresh processes. Issue 38's rows: clients that stop reading
// or open no window (writer.go), requests whose decoded size is many times their bytes
// (decode.go), and PodResources slots (prquota.go: other processes, this program run again,
// one holding 64 connections beside another's calls, 30 flooding List).
//
// TestAttacks (go test ./test/hostile, as root) runs every attack against podgate with its
// default limits and checks what each must hold: peak RSS within 384 MiB, the kubelet's Version
// answered throughout, a log line naming the attacking process where podgate refused it, and
// the attack's own check (every connection that stopped reading closed).
//
//	go run ./test/hostile                          # make attacks
//	go run ./test/hostile -podgate BIN -only TEXT  # a given build (the before of a change), some rows
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

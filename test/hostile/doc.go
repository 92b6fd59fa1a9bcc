// Command hostile runs the attacks of issue 30 (one local client that misbehaves at the HTTP/2
// level) against podgate, built from ./cmd/podgate and run in front of test/e2e/fakeruntime,
// and against that grpc-go server directly, and prints a table: each attack's RSS before and
// after (VmRSS, VmHWM of the process attacked), what the attacked server did, whether a
// kubelet-shaped client calling Version every 100 ms was answered throughout, and podgate's
// refusal log lines. Every attack is bounded in streams, bytes and time; each runs against
// fresh processes. Issue 38's PodResources rows (prquota.go) attack from other processes, this
// program run again: one holds 64 connections beside another's calls, 30 flood List; the same
// rows run as tests with podgate's default limits (go test ./test/hostile, as root).
//
//	go run ./test/hostile            # make attacks
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

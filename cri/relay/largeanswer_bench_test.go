package relay

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// BenchmarkLargeAnswer: one client calls for an answer of the size of a node's ListContainers
// (756 kB), directly from the server and through the relay, alternating in one run: the
// relay's CPU and allocations per answer show in -cpuprofile and -benchmem.
//
//	go test -run '^$' -bench LargeAnswer -benchmem -count 6 ./cri/relay
func BenchmarkLargeAnswer(b *testing.B) { benchAnswer(b, 756_000) }

// BenchmarkSmallAnswer is BenchmarkLargeAnswer with a Version-sized answer (30 bytes): what the
// relay costs a small call.
func BenchmarkSmallAnswer(b *testing.B) { benchAnswer(b, 30) }

// benchAnswer calls for answers of size bytes, directly and through the relay.
func benchAnswer(b *testing.B, size int) {
	dir := shortDir(b)
	tgt := startSizedServer(b, dir)
	sock := startRelay(b, dir, &Server{Route: func(string) *Target { return tgt }})
	dial := func(target string) *grpc.ClientConn {
		c, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(64<<20)))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	for _, path := range []string{"direct", "relay"} {
		var cl *grpc.ClientConn
		if path == "direct" {
			cl = dial("unix://" + dir + "/sized.sock")
		} else {
			cl = dial("unix://" + sock)
		}
		b.Run("path="+path, func(b *testing.B) {
			in := sizeRequest(size)
			for b.Loop() {
				var out []byte
				if err := cl.Invoke(context.Background(), "/svc/Big", &in, &out); err != nil || len(out) != size {
					b.Fatalf("%d bytes, %v", len(out), err)
				}
			}
		})
	}
}

package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Attacks on what decoding a request costs (issue 38): requests that are small on the wire and
// large decoded.

const createPath = "/runtime.v1.RuntimeService/CreateContainer"

// emptyEnvsRequest is a CreateContainerRequest of size bytes whose config.envs holds only
// empty entries, 2 bytes each on the wire and a pointer and a struct (some 100 bytes) decoded;
// it says how many.
func emptyEnvsRequest(size int) ([]byte, int) {
	req := (&runtimeapi.CreateContainerRequest{}).ProtoReflect().Descriptor()
	config := req.Fields().ByName("config")
	envs := config.Message().Fields().ByName("envs")
	entry := protowire.AppendVarint(protowire.AppendTag(nil, envs.Number(), protowire.BytesType), 0)
	// The config's own tag and length take at most 1 + 4 bytes.
	n := (size - 5) / len(entry)
	body := make([]byte, 0, n*len(entry))
	for range n {
		body = append(body, entry...)
	}
	return protowire.AppendBytes(protowire.AppendTag(nil, config.Number(), protowire.BytesType), body), n
}

// rawBytes sends a []byte as the message it encodes and takes the answer as bytes.
type rawBytes struct{}

func (rawBytes) Name() string { return "proto" }

func (rawBytes) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawBytes) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// emptyEnvs sends n CreateContainer requests of size bytes, all of empty envs, at once on one
// connection, and waits for their answers.
func emptyEnvs(ctx context.Context, sock string, n, size int) (string, func()) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawBytes{}), grpc.MaxCallSendMsgSize(size+1024)))
	if err != nil {
		return err.Error(), func() {}
	}
	msg, envs := emptyEnvsRequest(size)
	var mu sync.Mutex
	answers := map[string]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			var resp []byte
			err := conn.Invoke(ctx, createPath, &msg, &resp)
			st := status.Convert(err)
			how := st.Code().String()
			if err != nil {
				how += " (" + shorten(st.Message(), 90) + ")"
			}
			mu.Lock()
			answers[how]++
			mu.Unlock()
		})
	}
	wg.Wait()
	var parts []string
	for how, k := range answers {
		parts = append(parts, fmt.Sprintf("%d %s", k, how))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d × %.1f MiB (%d envs each) sent; %s", n, float64(len(msg))/(1<<20), envs, strings.Join(parts, ", ")), func() { conn.Close() }
}

// shorten cuts s to at most n bytes.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// budgets opens conns connections at once, each sending n UpdateContainerResources requests of
// size bytes that never end, as bodies does: together more than the process's budget, each
// within its connection's.
func budgets(ctx context.Context, sock string, conns, n, size int) (string, func()) {
	hs := make([]*h2conn, conns)
	sent := make([]int, conns)
	body := make([]byte, size)
	binary.BigEndian.PutUint32(body[1:5], uint32(size-5))
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() {
			h, err := dialH2(ctx, sock)
			if err != nil {
				return
			}
			hs[i] = h
			for j := range n {
				id := uint32(2*j + 1)
				if ctx.Err() != nil || h.open(id, grpcBlock(updatePath), false) != nil {
					return
				}
				got, _ := h.send(id, body, 2*time.Second)
				sent[i] += got
			}
		})
	}
	wg.Wait()
	total, closed, endings := 0, 0, map[string]int{}
	for i, h := range hs {
		total += sent[i]
		if h == nil || h.isClosed() {
			closed++
		}
		if h != nil {
			for how, k := range h.endings() {
				endings[how] += k
			}
		}
	}
	return fmt.Sprintf("%d MiB taken; %s; %d of %d connections closed", total>>20, summary(endings), closed, conns), func() {
		for _, h := range hs {
			if h != nil {
				h.close()
			}
		}
	}
}

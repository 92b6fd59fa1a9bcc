package main

// The attacks of issue 38 on the CRI socket's write path: clients that stop reading, that read
// but open no window, control frames on a connection with 999 calls open, and calls whose
// request never comes.

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/net/http2"
)

const (
	listPath    = "/runtime.v1.RuntimeService/ListContainers"
	versionPath = "/runtime.v1.RuntimeService/Version"
	// bigRuntime is the fake runtime of the attacks that need large answers: 30,000
	// containers, a ListContainers answer of about 21 MB (encoded once: -lists-once, so that
	// the fake's own work does not starve the kubelet's Version).
	bigRuntime = "30000"
)

// deafStats is what deafAfterBodies saw, for the test's checks.
type deafStats struct{ conns, closed int }

// deafAfterBodies: n connections each send 60 MiB of intercepted requests never ended (4 ×
// 15 MiB of UpdateContainerResources), then open every window, call ListContainers and stop
// reading their sockets. After wait it reads again: a connection the server closed ends once
// what its socket held is read.
func deafAfterBodies(ctx context.Context, sock string, n int, wait time.Duration, st *deafStats) (string, func()) {
	var conns []*h2conn
	var hears []func()
	taken := 0
	body := make([]byte, 15<<20)
	binary.BigEndian.PutUint32(body[1:5], 16<<20)
	for range n {
		h, err := dialH2(ctx, sock)
		if err != nil {
			continue
		}
		conns = append(conns, h)
		for s := range 4 {
			id := uint32(2*s + 1)
			if h.open(id, grpcBlock(updatePath), false) != nil {
				break
			}
			got, _ := h.send(id, body, 2*time.Second)
			taken += got
		}
		_ = h.openWindows()
		_ = h.call(9, listPath)
		hears = append(hears, h.deafen())
	}
	time.Sleep(wait) // the observation: what the server does with clients that read nothing
	for _, hear := range hears {
		hear()
	}
	*st = deafStats{conns: len(conns)}
	drained := time.Now().Add(3 * time.Second)
	for _, h := range conns {
		if h.waitClosed(time.Until(drained)) {
			st.closed++
		}
	}
	return fmt.Sprintf("%d MiB of bodies taken; %d of %d deaf connections closed within %s", taken>>20, st.closed, len(conns), wait), closeAll(conns)
}

// noWindow: n connections each call ListContainers calls times and read what comes, but never
// send a WINDOW_UPDATE; after wait, how the server ended their calls.
func noWindow(ctx context.Context, sock string, n, calls int, wait time.Duration) (string, func()) {
	var conns []*h2conn
	for range n {
		h, err := dialH2(ctx, sock)
		if err != nil {
			continue
		}
		conns = append(conns, h)
		for i := range calls {
			_ = h.call(uint32(2*i+1), listPath)
		}
	}
	time.Sleep(wait) // the observation
	closed := 0
	for _, h := range conns {
		if h.isClosed() {
			closed++
		}
	}
	return fmt.Sprintf("%d of %d connections closed; %s", closed, len(conns), summary(endingsOf(conns))), closeAll(conns)
}

// controlFrames opens 999 UpdateContainerResources calls whose request never comes on one
// connection, then sends frames control frames of kind ("window_update" or "settings") in
// batches of 1,000, each followed by a Version call whose answer says the server read them.
func controlFrames(ctx context.Context, sock, kind string, frames int) (string, func()) {
	h, err := dialH2(ctx, sock)
	if err != nil {
		return "dial: " + err.Error(), func() {}
	}
	for i := range 999 {
		if err := h.open(uint32(2*i+1), grpcBlock(updatePath), false); err != nil {
			return "open: " + err.Error(), h.close
		}
	}
	id := uint32(2*999 + 1)
	sync := func() error {
		defer func() { id += 2 }()
		if err := h.call(id, versionPath); err != nil {
			return err
		}
		if how, _ := h.waitEnd(id, 10*time.Second); how != "grpc-status 0" {
			return fmt.Errorf("version call: %q", how)
		}
		return nil
	}
	if err := sync(); err != nil {
		return err.Error(), h.close
	}
	start := time.Now()
	for sent := 0; sent < frames; sent += 1000 {
		err := h.write(func() error {
			for k := range 1000 {
				var err error
				if kind == "settings" {
					err = h.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: uint32(65535 + k%2)})
				} else {
					err = h.fr.WriteWindowUpdate(0, 1)
				}
				if err != nil {
					return err
				}
			}
			return nil
		})
		if err == nil {
			err = sync()
		}
		if err != nil {
			return fmt.Sprintf("after %d frames: %v", sent, err), h.close
		}
	}
	return fmt.Sprintf("%d %s frames read in %s", frames, kind, time.Since(start).Round(time.Millisecond)), h.close
}

// headerOnly opens calls calls of UpdateContainerResources whose request never comes on each
// of n connections, then makes a Version call on each, answered once the server has read them.
func headerOnly(ctx context.Context, sock string, n, calls int) (string, func()) {
	var conns []*h2conn
	open := 0
	for range n {
		h, err := dialH2(ctx, sock)
		if err != nil {
			continue
		}
		conns = append(conns, h)
		for i := range calls {
			if h.open(uint32(2*i+1), grpcBlock(updatePath), false) == nil {
				open++
			}
		}
		id := uint32(2*calls + 1)
		if h.call(id, versionPath) == nil {
			h.waitEnd(id, 10*time.Second)
		}
	}
	return fmt.Sprintf("%d calls open; %s", open, summary(endingsOf(conns))), closeAll(conns)
}

func endingsOf(conns []*h2conn) map[string]int {
	ends := map[string]int{}
	for _, h := range conns {
		for how, k := range h.endings() {
			ends[how] += k
		}
	}
	return ends
}

func closeAll(conns []*h2conn) func() {
	return func() {
		for _, h := range conns {
			h.close()
		}
	}
}

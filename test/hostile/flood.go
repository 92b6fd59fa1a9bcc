package main

// F4 (issue 47): what a connection has queued for its client beside DATA. 1,000 connections
// that never read flood PINGs, whose acknowledgements queue up; or make calls that podgate
// refuses quoting their 60 KB paths, whose refusals queue up, each costing what quoting the
// path costs.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
)

const (
	// f4Conns is how many connections flood with refused calls: 1,000, as the issue measured.
	f4Conns = 1000
	// f4PingConns is how many flood PINGs: more than the 1,000, whose acknowledgements
	// podgate kept (≈ 380 KB a connection, what it keeps before it stops reading) added up to
	// 388–400 MB here, too near 384 MiB to tell a fault from a fix.
	f4PingConns = 1200
	// f4For bounds how long they flood.
	f4For = 90 * time.Second
	// f4Stall is how long a write may wait before the client takes it that the server
	// stopped reading.
	f4Stall = 5 * time.Second
	// f4PathLen is the length of the refused path.
	f4PathLen = 60000
	// f4Probe is how many calls of each kind the CPU probe makes.
	f4Probe = 500
)

// floodStats is what a flood's connections saw.
type floodStats struct {
	sent                    atomic.Int64 // bytes the server's socket took
	stalled, broken, dialed atomic.Int64
}

func (s *floodStats) String() string {
	return fmt.Sprintf("%d connections: %.0f MB taken (%.0f KB each); %d stalled (the server stopped reading for %s), %d broken by the server",
		s.dialed.Load(), float64(s.sent.Load())/1e6, float64(s.sent.Load())/1e3/float64(max(s.dialed.Load(), 1)), s.stalled.Load(), f4Stall, s.broken.Load())
}

// floodConns opens n connections that never read, each saying HTTP/2's preface and SETTINGS and
// then writing what next gives it (its k-th write), at most pace bytes a second, until the
// server stops taking it (a write waits f4Stall), breaks the connection, or limit bytes are
// taken; at most f4For. It returns with the connections open.
//
// The pace spares the machine (the server's CPU is what all of them send, however fast) and
// has the connections fill what the server keeps for them at about the same time, within the
// server's write timeout (20 s), which closes a connection that took nothing for so long.
func floodConns(ctx context.Context, sock string, n, limit, pace int, next func(k int) []byte) (*floodStats, func()) {
	ctx, cancel := context.WithTimeout(ctx, f4For)
	defer cancel()
	st := new(floodStats)
	conns := make([]net.Conn, n)
	var preface bytes.Buffer
	preface.WriteString(http2.ClientPreface)
	_ = http2.NewFramer(&preface, nil).WriteSettings()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", sock)
			if err != nil {
				return
			}
			conns[i] = c
			st.dialed.Add(1)
			sent, start := 0, time.Now()
			for k := -1; sent < limit && ctx.Err() == nil; k++ {
				// The attacker's pace, not synchronisation.
				time.Sleep(time.Until(start.Add(time.Duration(float64(sent) / float64(pace) * float64(time.Second)))))
				b := preface.Bytes()
				if k >= 0 {
					b = next(k)
				}
				_ = c.SetWriteDeadline(time.Now().Add(f4Stall))
				m, err := c.Write(b)
				sent += m
				st.sent.Add(int64(m))
				if errors.Is(err, os.ErrDeadlineExceeded) {
					st.stalled.Add(1)
					return
				}
				if err != nil {
					st.broken.Add(1)
					return
				}
			}
		})
	}
	wg.Wait()
	return st, func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}
}

// pingBatch is 512 PING frames: 8.5 KB.
func pingBatch() []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	for i := range 512 {
		_ = fr.WritePing(false, [8]byte{byte(i >> 8), byte(i)})
	}
	return b.Bytes()
}

func f4Pings() attack {
	batch := pingBatch()
	return attack{
		name: fmt.Sprintf("F4: %d connections that never read flood PINGs, 48 KiB/s each, until the server stops reading (at most 4 MB)", f4PingConns),
		run: func(ctx context.Context, sock string) (string, func()) {
			st, cleanup := floodConns(ctx, sock, f4PingConns, 4<<20, 48<<10, func(int) []byte { return batch })
			return st.String(), cleanup
		},
	}
}

// The refused calls: the path podgate and grpc-go quote in their refusals, f4PathLen bytes of
// '%' (each quoted as "%25"), and the same bytes in a header neither quotes.
var (
	quotedBlock   = grpcBlock("/" + strings.Repeat("%", f4PathLen) + "/Version")
	unquotedBlock = grpcBlock("/hostile.Quote/Version", "x-pad", strings.Repeat("%", f4PathLen))
)

// callFrames are the frames of a call of block on stream id, ended with its headers: a HEADERS
// frame and a last CONTINUATION of a few bytes each, the rest in CONTINUATIONs of HTTP/2's
// default largest frame (16 KiB). The small frames at each end make the next call's first
// frame likely to be whole in what a server has read already when it ends a call's block.
func callFrames(id uint32, block []byte) []byte {
	var b bytes.Buffer
	fr := http2.NewFramer(&b, nil)
	const edge = 16
	if len(block) <= 2*edge {
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndStream: true, EndHeaders: true})
		return b.Bytes()
	}
	_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block[:edge], EndStream: true})
	middle := block[edge : len(block)-edge]
	for n := 0; len(middle) > 0; middle = middle[n:] {
		n = min(len(middle), 16384)
		_ = fr.WriteContinuation(id, false, middle[:n])
	}
	_ = fr.WriteContinuation(id, true, block[len(block)-edge:])
	return b.Bytes()
}

// quoteCost is what the server's CPU paid per refused call of each kind.
type quoteCost struct{ quoted, unquoted time.Duration }

func f4Quotes() attack {
	var got results[quoteCost]
	return attack{
		name: fmt.Sprintf("F4: calls refused quoting their %d KB path: CPU per call against the same bytes unquoted (%d each, answers read); then %d connections that never read make them, 2 a second each (at most 40)",
			f4PathLen/1000, f4Probe, f4Conns),
		on: func(ctx context.Context, t target) (string, func()) {
			var c quoteCost
			var err error
			if c.quoted, err = refusalCost(ctx, t, quotedBlock); err == nil {
				c.unquoted, err = refusalCost(ctx, t, unquotedBlock)
			}
			if err != nil {
				return err.Error(), func() {}
			}
			got.set(t.server, c)
			calls := make([][]byte, 40) // the same for every connection: made once
			for k := range calls {
				calls[k] = callFrames(uint32(2*k+1), quotedBlock)
			}
			st, cleanup := floodConns(ctx, t.sock, f4Conns, 40*len(quotedBlock), 120<<10, func(k int) []byte { return calls[k] })
			return fmt.Sprintf("CPU per refusal %s quoted, %s unquoted; then %s", c.quoted.Round(time.Microsecond),
				c.unquoted.Round(time.Microsecond), st), cleanup
		},
		check: func(outcome) error {
			c, _ := got.get("podgate")
			if c.quoted > 2*c.unquoted {
				return fmt.Errorf("a refusal quoting its %d KB path cost %s of CPU, over twice one that quotes none of the same bytes (%s)",
					f4PathLen/1000, c.quoted.Round(time.Microsecond), c.unquoted.Round(time.Microsecond))
			}
			return nil
		},
	}
}

// refusalCost makes f4Probe calls of block, which t refuses, one after the other on one
// connection that reads their answers, and returns the CPU t used per call.
func refusalCost(ctx context.Context, t target, block []byte) (time.Duration, error) {
	h, err := dialH2(ctx, t.sock)
	if err != nil {
		return 0, err
	}
	defer h.close()
	// The connection is up, and its SETTINGS taken, before the CPU is read.
	if err := h.call(1, versionPath); err != nil {
		return 0, err
	}
	if how, _ := h.waitEnd(1, 10*time.Second); how == "" {
		return 0, errors.New("no answer to Version")
	}
	before := threadsCPU(t.pid)
	for i := range f4Probe {
		id := uint32(2*i + 3)
		if err := h.open(id, block, true); err != nil {
			return 0, err
		}
		if how, _ := h.waitEnd(id, 30*time.Second); !strings.HasPrefix(how, "grpc-status") {
			return 0, fmt.Errorf("call %d: %q", i+1, how)
		}
	}
	return (threadsCPU(t.pid) - before) / f4Probe, nil
}

// f4AtOnce is how many refused calls the pipelining client sends before it reads.
const f4AtOnce = 100

// f4Pipelined: a client that reads its answers sends f4AtOnce calls refused quoting their
// 60 KB paths at once: the refusals (180 KB each, quoted) are more than the server keeps for a
// connection before it stops reading, and must still leave.
func f4Pipelined() attack {
	var got results[int]
	return attack{
		name: fmt.Sprintf("F4: one connection that reads sends %d calls refused quoting their %d KB path at once", f4AtOnce, f4PathLen/1000),
		on: func(ctx context.Context, t target) (string, func()) {
			n, did := pipelinedRefusals(ctx, t.sock)
			got.set(t.server, n)
			return did, func() {}
		},
		check: func(outcome) error {
			if n, _ := got.get("podgate"); n < f4AtOnce {
				return fmt.Errorf("%d of %d refusals came within 30 s", n, f4AtOnce)
			}
			return nil
		},
	}
}

// pipelinedRefusals sends the f4AtOnce calls at once and reads what comes, at most 30 s; it
// returns how many were answered. It reads frames without decoding their header blocks, as
// fast as the server writes: a client that keeps up with the server, so that what the server
// does not write is the server's doing.
func pipelinedRefusals(ctx context.Context, sock string) (int, string) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		return 0, err.Error()
	}
	defer c.Close()
	var calls bytes.Buffer
	calls.WriteString(http2.ClientPreface)
	_ = http2.NewFramer(&calls, nil).WriteSettings()
	for i := range f4AtOnce {
		calls.Write(callFrames(uint32(2*i+1), quotedBlock))
	}
	// Written from a goroutine: a server that stops reading holds the write up, not the count.
	go func() { _, _ = c.Write(calls.Bytes()) }()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReaderSize(c, 256<<10)
	var header [9]byte
	answered, frames := 0, 0
	for answered < f4AtOnce {
		if _, err := io.ReadFull(r, header[:]); err != nil {
			return answered, fmt.Sprintf("%d/%d refused within 30 s; then, after %d frames: %v", answered, f4AtOnce, frames, err)
		}
		frames++
		length := int(header[0])<<16 | int(header[1])<<8 | int(header[2])
		typ, flags := http2.FrameType(header[3]), http2.Flags(header[4])
		id := binary.BigEndian.Uint32(header[5:]) & (1<<31 - 1)
		if typ == http2.FrameHeaders && flags.Has(http2.FlagHeadersEndStream) && id%2 == 1 {
			answered++ // a trailers-only answer
		}
		if _, err := r.Discard(length); err != nil {
			return answered, err.Error()
		}
	}
	return answered, fmt.Sprintf("%d/%d refused", answered, f4AtOnce)
}

// threadsCPU is the CPU time pid's threads have run, to the nanosecond (schedstat): finer than
// readCPU's clock ticks, for the probe's short runs.
func threadsCPU(pid int) time.Duration {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "task")
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var ns int64
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "schedstat"))
		if err != nil {
			continue // the thread has ended
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			v, _ := strconv.ParseInt(f[0], 10, 64)
			ns += v
		}
	}
	return time.Duration(ns)
}

package main

// Client connections that read the way a slow or odd client does, for grpc-go clients: paced
// at a rate, in small chunks, with pauses; and a dialer that counts the connections it made.

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// readShape is how a client reads its socket: at most rate bytes a second (0: as fast as it
// can), at most chunk bytes a read (0: what the buffer takes), and after every pauseEvery
// bytes (0: never) a pause of pause.
type readShape struct {
	rate       int
	chunk      int
	pauseEvery int
	pause      time.Duration
}

// shapedConn is a client connection whose reads keep to a readShape.
type shapedConn struct {
	net.Conn
	shape readShape

	mu         sync.Mutex
	start      time.Time
	read       int64 // since start
	sincePause int   // bytes since the last pause
}

func (c *shapedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.shape
	if s.rate > 0 {
		// A read takes at most 20 ms worth, so that the rate holds within a second.
		p = p[:min(len(p), max(s.rate/50, 1))]
	}
	if s.chunk > 0 {
		p = p[:min(len(p), s.chunk)]
	}
	n, err := c.Conn.Read(p)
	if c.start.IsZero() {
		c.start = time.Now()
	}
	c.read += int64(n)
	if s.rate > 0 {
		// Pacing, not synchronisation: the read returns when the rate allows it.
		due := c.start.Add(time.Duration(float64(c.read) / float64(s.rate) * float64(time.Second)))
		time.Sleep(time.Until(due))
	}
	if s.pauseEvery > 0 {
		if c.sincePause += n; c.sincePause >= s.pauseEvery {
			c.sincePause = 0
			time.Sleep(s.pause) // the client's own pause: it stops reading for a while
		}
	}
	return n, err
}

// dialer makes a grpc-go client's connections to a unix socket, each reading with shape, and
// counts them.
type dialer struct {
	sock  string
	shape readShape
	dials atomic.Int64

	mu   sync.Mutex
	last net.Conn // the connection made last, for a client that breaks it off
}

func (d *dialer) dial(ctx context.Context, _ string) (net.Conn, error) {
	var nd net.Dialer
	c, err := nd.DialContext(ctx, "unix", d.sock)
	if err != nil {
		return nil, err
	}
	d.dials.Add(1)
	d.mu.Lock()
	d.last = c
	d.mu.Unlock()
	if d.shape == (readShape{}) {
		return c, nil
	}
	return &shapedConn{Conn: c, shape: d.shape}, nil
}

// breakOff closes the connection made last at once, under the client's feet.
func (d *dialer) breakOff() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last != nil {
		_ = d.last.Close()
	}
}

// client is a grpc-go client of sock through d, with more options; it receives messages up to
// 64 MiB (a ListContainers answer of the big runtime is 21 MB).
func (d *dialer) client(more ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(d.dial),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64 << 20)),
	}, more...)
	return grpc.NewClient("passthrough:///"+d.sock, opts...)
}

package podresources

// Who a client of the socket is: the credentials the kernel took when it connected (uid, pid),
// handed to the rate limit and the log through gRPC's AuthInfo.

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// peerID is a client of the socket: its process and user. pid 0 is a client whose
// credentials were not read.
type peerID struct {
	pid int32
	uid uint32
}

// peerConn is an accepted connection with its client's credentials, holding a connection
// slot until it closes, and closed by the header timeout unless it opens a call in time.
type peerConn struct {
	net.Conn
	peer    peerID
	release func()                     // gives the slot back
	header  atomic.Pointer[time.Timer] // set once the connection is accepted
	state   atomic.Int32               // connWaiting, then connCalled or connTimedOut
	once    sync.Once
}

// The states of a peerConn: waiting for its first call, then called or timed out.
const (
	connWaiting int32 = iota
	connCalled
	connTimedOut
)

// called records that c opened a call: the header timeout no longer applies.
func (c *peerConn) called() {
	if c.state.CompareAndSwap(connWaiting, connCalled) {
		c.stopHeader()
	}
}

func (c *peerConn) stopHeader() {
	if t := c.header.Load(); t != nil {
		t.Stop()
	}
}

// Close closes the connection and gives its slot back.
func (c *peerConn) Close() error {
	c.once.Do(func() {
		c.stopHeader()
		c.release()
	})
	return c.Conn.Close()
}

// peerInfo carries a connection's peerID to the tap and the handlers, and the connection to
// the tap.
type peerInfo struct {
	credentials.CommonAuthInfo
	peer peerID
	conn *peerConn
}

// AuthType names the credentials in gRPC's peer information.
func (peerInfo) AuthType() string { return "unix-peer" }

// peerCreds are the socket's transport credentials: no security of their own (the socket's
// mode and group keep strangers out), only the client's uid and pid, read when the connection
// was accepted, handed on as its AuthInfo.
type peerCreds struct{}

var _ credentials.TransportCredentials = peerCreds{}

func (peerCreds) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("podresources: peer credentials serve only")
}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	info := peerInfo{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}
	if pc, ok := c.(*peerConn); ok {
		info.peer, info.conn = pc.peer, pc
	}
	return c, info, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (peerCreds) Clone() credentials.TransportCredentials { return peerCreds{} }

func (peerCreds) OverrideServerName(string) error { return nil }

// peerOf is the client of a call's context.
func peerOf(ctx context.Context) peerID { return peerInfoOf(ctx).peer }

// peerInfoOf is the client and connection of a call's context.
func peerInfoOf(ctx context.Context) peerInfo {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(peerInfo); ok {
			return info
		}
	}
	return peerInfo{}
}

// watchCancelKey is the context key of a watch's cancel.
type watchCancelKey struct{}

// withWatchCancel gives a Watch's handler the cancel of its stream's context.
func withWatchCancel(ctx context.Context, cancel context.CancelFunc) context.Context {
	return context.WithValue(ctx, watchCancelKey{}, cancel)
}

// watchCancel is the cancel of a Watch's stream, or nil outside the socket's server.
func watchCancel(ctx context.Context) context.CancelFunc {
	cancel, _ := ctx.Value(watchCancelKey{}).(context.CancelFunc)
	return cancel
}

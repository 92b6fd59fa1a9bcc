package driver

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"

	"google.golang.org/grpc/peer"
)

// Caller identifies the process on the other end of a DRA gRPC connection: the kubelet, podgate,
// or a test. The end-to-end tests need it because the kubelet prepares a pod's claims itself,
// shortly before the sandbox is created: only the caller of the prepare that created an
// interface tells whether podgate prepared the claim before CNI ADD.
type Caller struct {
	// PID is the caller's process ID (in the driver's PID namespace), 0 if unknown.
	PID int32 `json:"pid"`
	// Comm is the caller's command name from /proc/PID/comm (at most 15 bytes, e.g. "kubelet",
	// "podgate"), empty if unknown.
	Comm string `json:"comm,omitempty"`
}

// callerAddr is the remote address of an accepted connection, carrying its caller: gRPC puts a
// connection's RemoteAddr into the peer of every call on it, so the driver finds the caller with
// peer.FromContext.
type callerAddr struct {
	net.Addr
	caller Caller
}

// callerConn is an accepted connection whose RemoteAddr names its caller.
type callerConn struct {
	net.Conn
	addr callerAddr
}

// RemoteAddr returns the peer address with the caller attached.
func (c *callerConn) RemoteAddr() net.Addr { return c.addr }

// callerListener wraps the DRA socket's listener to identify each connection's caller. It owns
// the socket file, as the helper's default listener would: a stale one is removed before
// listening, and Close removes it.
type callerListener struct {
	net.Listener
	path string
}

// listenWithCallers is the kubeletplugin.PluginListener of the driver's DRA socket.
func listenWithCallers(ctx context.Context, path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return nil, err
	}
	return &callerListener{Listener: ln, path: path}, nil
}

// Accept accepts a connection and looks up its caller.
func (l *callerListener) Accept() (net.Conn, error) {
	conn, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &callerConn{Conn: conn, addr: callerAddr{Addr: conn.RemoteAddr(), caller: connCaller(conn)}}, nil
}

// Close stops listening and removes the socket file.
func (l *callerListener) Close() error {
	err := l.Listener.Close()
	if rmErr := os.Remove(l.path); rmErr != nil && !errors.Is(rmErr, fs.ErrNotExist) {
		err = errors.Join(err, rmErr)
	}
	return err
}

// callerFrom returns the caller of the gRPC call ctx belongs to; the zero Caller if unknown.
func callerFrom(ctx context.Context) Caller {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Caller{}
	}
	if a, ok := p.Addr.(callerAddr); ok {
		return a.caller
	}
	return Caller{}
}

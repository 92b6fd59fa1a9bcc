package podresources

// Who a client of the socket is: the credentials the kernel took when it connected (uid, pid),
// handed to the rate limit and the log through gRPC's AuthInfo.

import (
	"context"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// peerID is a client of the socket: its process and user. pid 0 is a client whose
// credentials were not read.
type peerID struct {
	pid int32
	uid uint32
}

// peerConn is an accepted connection with its client's credentials.
type peerConn struct {
	net.Conn
	peer peerID
}

// peerInfo carries a connection's peerID to the tap and the handlers.
type peerInfo struct {
	credentials.CommonAuthInfo
	peer peerID
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
		info.peer = pc.peer
	}
	return c, info, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (peerCreds) Clone() credentials.TransportCredentials { return peerCreds{} }

func (peerCreds) OverrideServerName(string) error { return nil }

// peerOf is the client of a call's context.
func peerOf(ctx context.Context) peerID {
	if p, ok := peer.FromContext(ctx); ok {
		if info, ok := p.AuthInfo.(peerInfo); ok {
			return info.peer
		}
	}
	return peerID{}
}

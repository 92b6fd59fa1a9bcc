// Package relay forwards HTTP/2 (gRPC) calls between a client and the servers behind it frame
// by frame, without decoding their messages: a DATA frame a server sends is on its way to the
// client before the server's next frame arrives. A proxy built on a gRPC library receives a
// whole message before it can send its first byte, so every large answer crosses the machine
// twice, one transfer after the other; through the relay it costs one more hop's latency.
//
// The relay keeps HTTP/2's rules on each connection, as a proxy must: its own SETTINGS, flow
// control on both sides (it holds at most one stream window of a call's bytes for a reader
// that is slower than the writer, and gives a writer its window back only as the bytes leave),
// header compression per connection, stream ids of its own upstream. What it cannot pass on
// it answers as gRPC does: Unavailable when a server cannot be reached or its connection
// breaks, REFUSED_STREAM for the calls a server's GOAWAY did not take.
//
// Each client connection gets its own connection to each server it calls (a Target), so a
// client that stops reading holds up only its own calls. podgate's CRI server (package cri)
// routes the calls it does not intercept to the runtime this way, and answers the calls it
// intercepts in the process (Target.Unary), whose handlers send them on to the runtime on the
// same client's connection to it (UnaryCall.Forward).
//
// Inside, a call is a stream of one of three kinds (streamKind): passthrough, between the
// client and a server; answered in the process (unaryCall), whose request a handler takes and
// whose answer it gives; forwarded (forwarded), a handler's call to a server, whose answer the
// handler takes. A fourth, answered, is a call whose answer is settled while the client may
// still send: the relay answered it itself, or its server answered whole and reset the
// request (a passthrough becomes one then); what the client sends on it is dropped. The flow
// functions hand a stream's frames to its kind, request or answer, along the two ways the
// stream fixes as it begins (stream.req, stream.ans: which endpoints each goes between), so
// none of them tests which kind a stream is. The kinds are an interface rather than a struct of
// handlers because each is already a type with state of its own (the request's bytes, the
// handler's wait), and an interface value of an empty struct costs the passthrough nothing.
//
// No client can take the relay down (Limits): what it holds for a client, requests not yet
// handed on and answers the client has not taken, counts against a budget per connection and
// one per process (chargeLocked, forceChargeLocked), a call's grpc-timeout applies from its
// headers and a request without one must arrive within RequestTimeout, a connection without
// calls closes after IdleTimeout, one that answers no PING after KeepaliveTimeout, one that takes
// nothing written to it after WriteTimeout, an answer left on a shut window is reset after
// WindowTimeout, and the connections are capped. A client that goes over a limit is refused,
// logged once per connection (its pid and uid from SO_PEERCRED, at most a line a second per
// reason) and counted (Server.Refused).
//
// Frames are encoded into memory (endpoint.out) under the endpoint's wmu, which is never held
// across a write. A flush writes them at once as far as the socket takes them without waiting
// (a non-blocking write: no goroutine to wake on the usual path), and hands the rest, with the
// right to write, to the connection's one writer goroutine (endpoint.writeLoop), the only one
// that ever waits for a peer, as grpc-go's transports have one. A client that stops reading
// blocks its writer alone: keepalive, timeouts, resets, sheds and closes only encode or close,
// and DATA beyond a few writes' worth (outRoom) waits in its stream's queue, counted.
//
// Flow control keeps its arithmetic in one type (window, RFC 9113 §6.9). The steps that move
// windows and frames run under the session's mu and return what is left to do (a todo: frames
// to encode, a stream's end to tell); session.unlock encodes the frames under mu, so that they
// leave in the order their windows were counted, lets mu go and does the rest. A
// WINDOW_UPDATE or SETTINGS touches only the streams with bytes waiting (endpoint.waiting), and
// a change of SETTINGS_INITIAL_WINDOW_SIZE none (half.sendSize).
package relay

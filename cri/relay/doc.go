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
package relay

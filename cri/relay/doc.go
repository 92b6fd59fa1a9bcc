// Package relay forwards HTTP/2 (gRPC) calls between a client and the servers behind it frame
// by frame, without decoding their messages: a DATA frame a server sends is on its way to the
// client before the server's next frame arrives. A proxy built on a gRPC library receives a
// whole message before it can send its first byte, so every large answer crosses the machine
// twice, one transfer after the other; through the relay it costs one more hop's latency.
//
// The relay keeps HTTP/2's rules on each connection, as a proxy must: its own SETTINGS, flow
// control on both sides (it holds at most one stream window of a call's bytes for a reader
// that is slower than the writer, and gives a writer its window back as the bytes leave),
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
// # Concurrency
//
// A session is one client connection and its connections to the targets (conn). Each conn has
// one reader goroutine, which alone reads its frames, and one sender, whose owner alone decides
// and writes everything the connection sends: DATA, header blocks, WINDOW_UPDATE, SETTINGS and
// their acknowledgement, PING answers, RST_STREAM, GOAWAY; the peer's windows and settings,
// the streams' queues and turns, HPACK's encoder are the owner's (sender.o). The owner is
// whoever holds the sender's token: every other goroutine only puts events to the sender
// (sender.put, an append under sender.mu) and kicks it, which makes the kicker the owner if
// nobody is — it writes without waiting for the socket, the usual case — and the sender's
// writer goroutine, handed the token when the socket takes no more, is the only goroutine that
// ever waits for a peer. A reader that reads DATA for another connection takes that sender's
// token for the frames of one read when it can, so the bytes leave from its read buffer with
// one writev (conn.lend); a connection to a target reads on, without waiting, what its socket
// already holds before it lets them go (readBuf.more), so one writev carries the frames of
// several of the target's writes. What a call is — its kind, its two ways, its ids, whether each way
// ended — is the session's, under session.mu; the steps taken under it (the *Locked functions)
// only decide and put events, and return what is left to do once mu is let go (after): a
// kick, the observer's End, a handler to start, a reset.
//
// The locks, in the order they may be taken: session.mu, then Server.mu (a charge over the
// process's budget: shedStuck) or a sender's mu (put); no function returns holding one or hands
// one to its callee. A sender's token is not a lock: it is only tried, never waited for, and
// nobody holding session.mu or Server.mu kicks a sender, because its owner calls the session's
// hooks (senderHooks), which take session.mu.
//
// # Kinds of call
//
// A call is a stream of one of three kinds (streamKind): passthrough, between the client and a
// server; answered in the process (unaryCall), whose request a handler takes and whose answer
// it gives; forwarded (forwarded), a handler's call to a server, whose answer the handler
// takes. A fourth, answered, is a call whose answer is settled while the client may still send:
// the relay answered it itself, or its server answered whole and reset the request (a
// passthrough becomes one then); what the client sends on it is dropped. A stream's two ways
// (stream.req, stream.ans) say where its bytes come from (a conn, or a handler) and where they
// go (a sendStream at a sender, or a handler), so the flow functions never test which kind a
// stream is; it is forgotten once the end of each way has reached where it goes.
//
// # Limits
//
// No client can take the relay down (Limits): what it holds for a client — requests not yet
// handed on, answers and every other frame put for it and not yet written — counts against a
// budget per connection and one per process (chargeLocked, session.hold). Over the process's
// budget the connections that are stuck are closed (shedStuck): those whose client has not
// finished sending its requests, or has not taken answers for a while with none of them
// leaving; a client that reads is never closed for it. A call's grpc-timeout applies from its
// headers and a request without one must arrive within RequestTimeout, a connection without
// calls closes after IdleTimeout, one that answers no PING after KeepaliveTimeout, one that
// takes nothing written to it after WriteTimeout, an answer left on a shut window is reset
// after WindowTimeout, a reader stops reading while more than 50 of its frames' answers wait,
// and the connections are capped. A client that goes over a limit is refused, logged once per
// connection (its pid and uid from SO_PEERCRED, at most a line a second per reason) and
// counted (Server.Refused).
package relay

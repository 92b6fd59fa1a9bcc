// Package cri is podgate's CRI proxy: it serves runtime.v1.RuntimeService and
// runtime.v1.ImageService on a unix socket and forwards every call to a backend runtime
// (containerd).
//
// The socket is served by a frame-level HTTP/2 relay (package cri/relay). Calls that podgate does
// not intercept go through it to the runtime frame by frame: never decoded, so fields and
// methods newer than podgate's k8s.io/cri-api reach the backend unchanged, and a large List
// answer reaches the kubelet while containerd is still sending it. A method that someone
// registered an [Interceptor] (or an observer, [Observe]) for the relay answers in the process:
// it hands the request's message, metadata and deadline to the method's handler, which decodes
// it with k8s.io/cri-api, runs the hooks and forwards, on the caller's own connection to the
// backend (the one its passed-through calls take), so an intercepted call costs a
// passed-through one's hop plus its hooks. If the hooks leave the request (or the response)
// unchanged, or only observe, the original bytes are forwarded, so the backend still sees
// exactly what the kubelet sent. Before an intercepted request is decoded, its bytes are walked
// (decodecost.go): a list or map with more entries than any kubelet could send is refused
// InvalidArgument naming it, and what decoding will allocate counts against the relay's memory
// budget (relay.UnaryCall.Hold) until the call is done. Calls of services that are not CRI are
// refused. Stats handlers (tracing) see every call as a gRPC server's and client's would.
//
// Methods newer than podgate's cri-api pass through untouched, counted as "other", but for the
// ones it knows by name (newer.go: cri-api v0.38's security-profile methods), counted under
// their names; a hook on one of them ([InterceptRaw], [PullSecurityProfile]) gets the request's
// bytes, pre-scanned and held along a v0.37 message of the same fields, and forwards them byte
// for byte.
//
// The package knows nothing of DRA, sysctls or PodResources: the agent package plugs those in
// through [Intercept], [Observe] and [InterceptRaw]. Errors are mapped to gRPC codes once, in the instrumented
// boundary ([Server] records per-method metrics there); an error that already is a gRPC
// status, such as one from containerd, passes through unchanged.
//
// podgate's own calls to the runtime take [Server.RuntimeClient], whose lists stream where the
// runtime serves list streaming (KEP-5825), falling back to the unary List ([StreamingLists]):
// a node's list may be more than one message can hold.
//
// [StopGracefully] is the one graceful stop with a deadline of podgate's gRPC servers (the
// PodResources server's).
package cri

// Package cri is podgate's CRI proxy: a gRPC server on a unix socket that serves
// runtime.v1.RuntimeService and runtime.v1.ImageService and forwards every call to a backend
// runtime (containerd).
//
// Calls that podgate does not intercept are forwarded as raw bytes: they are never decoded, so
// fields and methods newer than podgate's k8s.io/cri-api reach the backend unchanged and large
// List responses cost no decode or encode. A method that someone registered an [Interceptor] for
// is decoded with k8s.io/cri-api; if the interceptors leave the request (or the response)
// unchanged, the original bytes are forwarded, so the backend still sees exactly what the
// kubelet sent.
//
// The package knows nothing of DRA, sysctls or PodResources: the agent package plugs those in
// through [Intercept]. Errors are mapped to gRPC codes once, in the instrumented boundary
// ([Server] records per-method metrics there); an error that already is a gRPC status, such as
// one from containerd, passes through unchanged.
//
// [StopGracefully] is the one graceful stop with a deadline of podgate's gRPC servers, this
// proxy's and the PodResources server's.
package cri

// Package dratest is podgate's fake DRA driver for unit tests, the one fake of both package dra's
// tests and agent's: a real gRPC server on a unix socket serving the DRA service (v1 and
// v1beta1, as a driver built with the upstream kubeletplugin helper serves them, or only one of
// them), and a real registration socket in a plugin registry directory answering GetInfo. It
// records the calls it gets (per claim, and by full gRPC method) and lets a test make them fail,
// hang, leave claims out, or advertise a registration podgate must refuse.
//
// It is distinct from test/dradriver, the real driver built on
// k8s.io/dynamic-resource-allocation/kubeletplugin that the end-to-end tests run, because the
// helper cannot give unit tests what they check: it reads every claim it is asked to prepare
// from the API server (a unit test calls the DRA service with bare claim references), it writes
// its registration itself (no other plugin type, no other advertised versions, no GetInfo that
// fails or is slow), it fails or omits claims only through a plugin's Go code, and
// test/dradriver's driver creates veth pairs (root and a network namespace). Package dra's
// TestKubeletPluginDriver checks podgate against the real helper; this fake covers the rest.
package dratest

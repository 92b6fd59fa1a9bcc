// Package rig runs the DRA feature's stages — the manager's prepare, the attacher's attach —
// in podgate's CRI server and sandbox pipeline, on real unix sockets, in front of cri-client's
// fake runtime, with package dratest's fake driver registered in a real plugin registry
// directory and client-go's fake API server behind the narrow interfaces the feature declares.
// The tests of dra/manager and dra/attach start and remove pods through it, crash and restart
// podgate from its checkpoint, as the agent wires the feature (agent's own tests cover that
// wiring).
package rig

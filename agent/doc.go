// Package agent is podgate's composition root: it builds the pieces from a validated
// configuration (agent/config), wires each intercepted CRI method's stages in a written order
// (pipeline.go for the pod sandbox, methods.go for the other methods), owns start-up, the
// metrics and health server, and graceful shutdown. The pod registry (agent/registry) and the
// Kubernetes API access (agent/kube) are its sub-packages; no package imports agent.
package agent

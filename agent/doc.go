// Package agent is podgate's composition root: it builds the pieces from a validated
// configuration (agent/config), wires each intercepted CRI method's stages in a written order
// (pipeline.go for the pod sandbox, methods.go for the other methods), owns start-up, the
// metrics and health server, and graceful shutdown. Its sub-packages are the adapters features
// never import (agent/kube, the Kubernetes API) and the leaves it hands features values from
// (agent/config, agent/kubeletinfo); nothing outside agent and cmd imports it.
//
// Start-up builds each piece once, complete, from the values the pieces before it return, so
// that the order is the one the types allow: the state on disk (openState) and the Kubernetes
// API (newKube, nil without it), then the pod Events (newEvents, from the API) and tracing
// (tracing.New), then the proxy with every feature (buildProxy, from all of them), then the
// listeners (openServices). What podgate learns later, from the Node (node.go), reaches the
// features through the functions agent handed them (the kubelet's description) and memory
// QoS's ceiling (ResolveAllocatable). A feature that is off is not built: it adds no stage, no
// hook and no runnable.
package agent

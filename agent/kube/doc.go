// Package kube is podgate's access to the Kubernetes API: a client that knows only core/v1 and
// resource.k8s.io/v1 (API, Client), the informer of the pods bound to this node (PodLookup:
// from the kubelet's local Pods API where the kubelet 1.37 serves it, else from the API server
// scoped by spec.nodeName, never a cluster-wide watch), and get-or-fetch for a pod the informer
// has not delivered yet, with one GET for a burst of callers. Claims are read by GET on demand.
package kube

// Package v1alpha1 is podgate's PodResources API (podgate.podresources.v1alpha1): the messages
// and the gRPC client and server of the PodResources service, generated from podresources.proto
// by make generate; do not edit the .pb.go files.
package v1alpha1

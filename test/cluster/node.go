//go:build linux

package cluster

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RegisterNode creates the cluster's Node object as a kubelet registers its node, for a cluster
// that runs without a kubelet (Options.DeferKubelet): DRA drivers publish their ResourceSlices
// only for a Node that exists. A Node that exists already is returned as it is; a kubelet started
// later takes it over, as it takes over its own Node after a restart.
func (c *Cluster) RegisterNode(ctx context.Context) (*corev1.Node, error) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   c.nodeName,
		Labels: map[string]string{corev1.LabelHostname: c.nodeName, corev1.LabelOSStable: "linux"},
	}}
	got, err := c.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = c.client.CoreV1().Nodes().Get(ctx, c.nodeName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("register node %s: %w", c.nodeName, err)
	}
	return got, nil
}

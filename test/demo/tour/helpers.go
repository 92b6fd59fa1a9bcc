//go:build linux

package tour

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/scrape"
)

const (
	// pollInterval is how often a step looks again for what it waits for.
	pollInterval = 10 * time.Millisecond
	// waitTimeout bounds each wait of a step: a pull takes about a second, a pod start less;
	// two cores under a parallel build may take many times as long.
	waitTimeout = 2 * time.Minute
)

// waitFor polls cond until it holds. An error from cond ends the wait.
func (e *Env) waitFor(ctx context.Context, what string, cond wait.ConditionWithContextFunc) error {
	if err := wait.PollUntilContextTimeout(ctx, pollInterval, waitTimeout, true, cond); err != nil {
		return fmt.Errorf("wait for %s: %w", what, err)
	}
	return nil
}

// waitMetric waits until podgate's metric name with labels (name, value pairs) has value.
func (e *Env) waitMetric(ctx context.Context, what, name string, value float64, labels ...string) error {
	var last float64
	err := e.waitFor(ctx, what, func(ctx context.Context) (bool, error) {
		m, err := e.Podgate.Scrape(ctx)
		if err != nil {
			return false, err
		}
		last, _ = m.Value(name, labels...)
		return last == value, nil
	})
	if err != nil {
		return fmt.Errorf("%w (%s%v is %g, want %g)", err, name, labels, last, value)
	}
	return nil
}

// gauge is a counter's or gauge's value as a whole number, 0 when the page lacks it.
func gauge(m scrape.Metrics, name string, labels ...string) int {
	v, _ := m.Value(name, labels...)
	return int(v)
}

// sandboxConfig is the sandbox config the kubelet sends for the pod.
func (e *Env) sandboxConfig(pod *corev1.Pod) *runtimeapi.PodSandboxConfig {
	return dranode.SandboxConfig(pod, filepath.Join(e.Rig.Dir, "pods"))
}

// randomImage is an image of one layer of layerSize random bytes.
func randomImage() (v1.Image, error) {
	return random.Image(layerSize, 1)
}

// withRandomLayer is base with one more layer of layerSize random bytes, of base's media type.
func withRandomLayer(base v1.Image) (v1.Image, error) {
	mt, err := base.MediaType()
	if err != nil {
		return nil, err
	}
	layerType := types.DockerLayer
	if mt == types.OCIManifestSchema1 {
		layerType = types.OCILayer
	}
	layer, err := random.Layer(layerSize, layerType)
	if err != nil {
		return nil, err
	}
	return mutate.AppendLayers(base, layer)
}

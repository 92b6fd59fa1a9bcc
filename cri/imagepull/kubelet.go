package imagepull

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// MaskedBy lists podgate's caps that a kubelet holding at most kubeletCap pulls in flight
// (its serializeImagePulls: 1, or its maxParallelImagePulls) makes moot: each cap at or above
// kubeletCap, named by its configuration key. Such a cap never queues a pull — the kubelet
// waits before podgate sees the pull — so podgate's priorities never order anything under it.
// kubeletCap 0 (the kubelet has no cap) masks nothing.
func (l Limits) MaskedBy(kubeletCap int) []string {
	if kubeletCap <= 0 {
		return nil
	}
	var masked []string
	if l.MaxParallel > 0 && l.MaxParallel >= kubeletCap {
		masked = append(masked, fmt.Sprintf("imagePulls.maxParallel (%d)", l.MaxParallel))
	}
	hosts := make([]string, 0, len(l.PerRegistry))
	for host := range l.PerRegistry {
		hosts = append(hosts, host)
	}
	slices.Sort(hosts)
	for _, host := range hosts {
		if n := l.PerRegistry[host]; n >= kubeletCap {
			masked = append(masked, fmt.Sprintf("imagePulls.perRegistry[%s] (%d)", host, n))
		}
	}
	return masked
}

// Capped tells whether l caps anything at all.
func (l Limits) Capped() bool { return l.MaxParallel > 0 || len(l.PerRegistry) > 0 }

// WithKubeletCap says the kubelet's own cap on pulls in flight, read from its configuration
// (serializeImagePulls: 1; maxParallelImagePulls; 0: none), so that the metric
// podgate_image_pull_kubelet_cap shows it beside podgate's caps, with below_podgate "true"
// when it makes one of them moot (Limits.MaskedBy). Without it (the kubelet's configuration
// not read), the metric is not exported.
func WithKubeletCap(n int) FeatureOption {
	return func(c *featureConfig) { c.kubeletCap = &n }
}

// registerKubeletCap exports the kubelet's cap beside limits.
func registerKubeletCap(reg prometheus.Registerer, limits Limits, n int) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: "podgate", Subsystem: "image_pull", Name: "kubelet_cap",
		Help: "The kubelet's own cap on image pulls in flight (serializeImagePulls: 1, else maxParallelImagePulls; 0: none); below_podgate is true when it is at or below one of podgate's caps, which then never queues a pull.",
	}, []string{"below_podgate"})
	g.WithLabelValues(strconv.FormatBool(len(limits.MaskedBy(n)) > 0)).Set(float64(n))
	if reg != nil {
		reg.MustRegister(g)
	}
}

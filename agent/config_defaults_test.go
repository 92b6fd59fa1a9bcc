package agent

import (
	"testing"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/agent/kube"
	"github.com/podgate/podgate/cri/relay"
	"github.com/podgate/podgate/dra"
	"github.com/podgate/podgate/podresources"
)

// TestConfigDefaultsMatchFeatures: config keeps its own copies of the features' defaults, so
// that it imports no feature; each copy must equal the feature's constant.
func TestConfigDefaultsMatchFeatures(t *testing.T) {
	for _, c := range []struct {
		name            string
		config, feature any
	}{
		{"podResources.qps", config.DefaultPodResourcesQPS, podresources.DefaultQPS},
		{"podResources.burst", config.DefaultPodResourcesBurst, podresources.DefaultBurst},
		{"podResources.kubeletQPS", config.DefaultPodResourcesKubeletQPS, podresources.DefaultKubeletQPS},
		{"podResources.kubeletBurst", config.DefaultPodResourcesKubeletBurst, podresources.DefaultKubeletBurst},
		{"podResources.maxConnections", config.DefaultPodResourcesMaxConnections, podresources.DefaultMaxConnections},
		{"podResources.maxStreams", config.DefaultPodResourcesMaxStreams, podresources.DefaultMaxStreams},
		{"podResources.idleTimeout", config.DefaultPodResourcesIdleTimeout, podresources.DefaultIdleTimeout},
		{"podResources.maxStreamsPerProcess", config.DefaultPodResourcesMaxStreamsPerProcess, podresources.DefaultMaxStreamsPerProcess},
		{"podResources' watches", config.DefaultPodResourcesMaxWatches, podresources.DefaultMaxWatchers},
		{"podResources.headerTimeout", config.DefaultPodResourcesHeaderTimeout, podresources.DefaultHeaderTimeout},
		{"podResources.watchSendTimeout", config.DefaultPodResourcesWatchSendTimeout, podresources.DefaultWatchSendTimeout},
		{"kubeletPodsAPISocket", config.DefaultKubeletPodsAPISocket, kube.DefaultKubeletPodsAPISocket},
		{"events.qps", config.DefaultEventQPS, kube.DefaultEventQPS},
		{"events.burst", config.DefaultEventBurst, kube.DefaultEventBurst},
		{"dra.interfaceNameAttribute", config.DefaultInterfaceNameAttribute, dra.DefaultInterfaceNameAttribute},
		{"criSocketLimits.connectionBytes", int64(config.DefaultCRIConnectionBytes), relay.DefaultLimits.ConnectionBytes},
		{"criSocketLimits.totalBytes", int64(config.DefaultCRITotalBytes), relay.DefaultLimits.TotalBytes},
		{"criSocketLimits.maxConnections", config.DefaultCRIMaxConnections, relay.DefaultLimits.MaxConnections},
		{"criSocketLimits.maxHeaderListBytes", uint32(config.DefaultCRIMaxHeaderListBytes), relay.DefaultLimits.MaxHeaderList},
		{"criSocketLimits.idleTimeout", config.DefaultCRIIdleTimeout, relay.DefaultLimits.IdleTimeout},
		{"criSocketLimits.keepaliveTime", config.DefaultCRIKeepaliveTime, relay.DefaultLimits.KeepaliveTime},
		{"criSocketLimits.keepaliveTimeout", config.DefaultCRIKeepaliveTimeout, relay.DefaultLimits.KeepaliveTimeout},
		{"criSocketLimits.requestTimeout", config.DefaultCRIRequestTimeout, relay.DefaultLimits.RequestTimeout},
		{"criSocketLimits.writeTimeout", config.DefaultCRIWriteTimeout, relay.DefaultLimits.WriteTimeout},
		{"criSocketLimits.windowTimeout", config.DefaultCRIWindowTimeout, relay.DefaultLimits.WindowTimeout},
	} {
		if c.config != c.feature {
			t.Errorf("%s: config's default %v, the feature's %v", c.name, c.config, c.feature)
		}
	}
}

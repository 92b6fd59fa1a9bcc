package config

import (
	"strings"
	"testing"
	"time"
)

// TestPodResourcesKubeletLimits: podgate's own bucket toward the kubelet's socket defaults to
// half the kubelet's, takes what the file says, and must be positive.
func TestPodResourcesKubeletLimits(t *testing.T) {
	c, err := Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.PodResources; p.KubeletQPS != DefaultPodResourcesKubeletQPS || p.KubeletBurst != DefaultPodResourcesKubeletBurst ||
		p.QPS != DefaultPodResourcesQPS || p.Burst != DefaultPodResourcesBurst {
		t.Errorf("defaults: qps %v burst %d kubeletQPS %v kubeletBurst %d", p.QPS, p.Burst, p.KubeletQPS, p.KubeletBurst)
	}
	if 2*DefaultPodResourcesKubeletBurst > 10 || DefaultPodResourcesKubeletQPS > 100 {
		t.Errorf("default kubeletQPS %v and kubeletBurst %d: twice the burst and the rate must fit the kubelet's 100 QPS, burst 10",
			DefaultPodResourcesKubeletQPS, DefaultPodResourcesKubeletBurst)
	}
	c, err = Parse([]byte(header + "podResources: {kubeletQPS: 20, kubeletBurst: 2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.PodResources; p.KubeletQPS != 20 || p.KubeletBurst != 2 {
		t.Errorf("values not read: kubeletQPS %v kubeletBurst %d", p.KubeletQPS, p.KubeletBurst)
	}
	c, err = Parse([]byte(header + "podResources: {kubeletQPS: -1, kubeletBurst: -2}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	if err == nil || !strings.Contains(err.Error(), "podResources.kubeletQPS: -1") || !strings.Contains(err.Error(), "podResources.kubeletBurst: -2") {
		t.Errorf("negative limits: %v, want both keys named", err)
	}
}

// TestPodResourcesConnectionLimits: the socket's caps on connections and streams and its idle
// timeout have their defaults, take what the file says, and must be positive.
func TestPodResourcesConnectionLimits(t *testing.T) {
	c, err := Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.PodResources; p.MaxConnections != DefaultPodResourcesMaxConnections || p.MaxStreams != DefaultPodResourcesMaxStreams ||
		p.IdleTimeout.Duration != DefaultPodResourcesIdleTimeout {
		t.Errorf("defaults: maxConnections %d maxStreams %d idleTimeout %v", p.MaxConnections, p.MaxStreams, p.IdleTimeout)
	}
	c, err = Parse([]byte(header + "podResources: {maxConnections: 8, maxStreams: 4, idleTimeout: 30s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.PodResources; p.MaxConnections != 8 || p.MaxStreams != 4 || p.IdleTimeout.Duration != 30*time.Second {
		t.Errorf("values not read: maxConnections %d maxStreams %d idleTimeout %v", p.MaxConnections, p.MaxStreams, p.IdleTimeout)
	}
	c, err = Parse([]byte(header + "podResources: {maxConnections: -1, maxStreams: -2, idleTimeout: -1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{"podResources.maxConnections: -1", "podResources.maxStreams: -2", "podResources.idleTimeout: -1s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("negative limits: %v, want %q", err, want)
		}
	}
	c, err = Parse([]byte(header + "podResources: {idleTimeout: 100ms}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "podResources.idleTimeout: 100ms") {
		t.Errorf("an idle timeout under a second: %v, want it refused", err)
	}
}

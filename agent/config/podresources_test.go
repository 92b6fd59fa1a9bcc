package config

import (
	"fmt"
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

// TestPodResourcesPerClientQuotas: the per-process and per-user quotas default to shares of the
// socket's totals (a quarter, three quarters), follow a total the file sets, take what the file
// says, and must nest: a process's within its user's, a user's within the socket's.
func TestPodResourcesPerClientQuotas(t *testing.T) {
	c, err := Parse([]byte(header))
	if err != nil {
		t.Fatal(err)
	}
	p := c.PodResources
	got := []any{p.MaxConnectionsPerProcess, p.MaxConnectionsPerUser, p.MaxStreamsPerProcess, p.MaxStreamsPerUser,
		p.MaxWatchesPerProcess, p.MaxWatchesPerUser, p.QPSPerUser, p.BurstPerUser, p.HeaderTimeout.Duration, p.WatchSendTimeout.Duration}
	want := []any{16, 48, 32, 96, 16, 48, 200.0, 200, 10 * time.Second, 30 * time.Second}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("defaults %v, want %v", got, want)
	}
	c, err = Parse([]byte(header + "podResources: {maxConnections: 8, qps: 5, burst: 7}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p := c.PodResources; p.MaxConnectionsPerProcess != 2 || p.MaxConnectionsPerUser != 6 || p.QPSPerUser != 10 || p.BurstPerUser != 14 {
		t.Errorf("from maxConnections 8, qps 5, burst 7: per process %d, per user %d connections, qps %v, burst %d; want 2, 6, 10, 14",
			p.MaxConnectionsPerProcess, p.MaxConnectionsPerUser, p.QPSPerUser, p.BurstPerUser)
	}
	c, err = Parse([]byte(header + "podResources: {maxConnectionsPerProcess: 4, maxStreamsPerUser: 40, headerTimeout: 5s, watchSendTimeout: 1m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("quotas within each other: %v", err)
	}
	if p := c.PodResources; p.MaxConnectionsPerProcess != 4 || p.MaxStreamsPerUser != 40 || p.HeaderTimeout.Duration != 5*time.Second || p.WatchSendTimeout.Duration != time.Minute {
		t.Errorf("values not read: %+v", p)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"{maxConnectionsPerProcess: 40, maxConnectionsPerUser: 30}", "podResources.maxConnectionsPerProcess: 40: must be at most maxConnectionsPerUser (30)"},
		{"{maxConnectionsPerUser: 100}", "podResources.maxConnectionsPerUser: 100: must be at most the socket's 64"},
		{"{maxWatchesPerProcess: -1}", "podResources.maxWatchesPerProcess: -1: must be positive"},
		{"{maxStreamsPerProcess: 64}", ""}, // its user's follows: three times, 192
		{"{qpsPerUser: 50}", "podResources.qpsPerUser: 50: must be at least qps (100)"},
		{"{burstPerUser: 5}", "podResources.burstPerUser: 5: must be at least burst (100)"},
		{"{headerTimeout: 10ms, watchSendTimeout: 500ms}", "podResources.headerTimeout: 10ms: must be at least 1s"},
		{"{watchSendTimeout: 500ms}", "podResources.watchSendTimeout: 500ms: must be at least 1s"},
	} {
		c, err := Parse([]byte(header + "podResources: " + tc.yaml + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Validate()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v, want it accepted", tc.yaml, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := Parse([]byte(header + "podResources: {maxConnectionsPerPid: 4}\n")); err == nil {
		t.Error("an unknown key was accepted: the decoding is not strict")
	}
}

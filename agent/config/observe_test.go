package config

import (
	"strings"
	"testing"
	"time"
)

// TestEventsTracingAndProgressConfig: the keys of issue 19, their defaults and what is refused.
func TestEventsTracingAndProgressConfig(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr []string
		check   func(t *testing.T, c *Configuration)
	}{
		{name: "defaults", doc: "", check: func(t *testing.T, c *Configuration) {
			if c.Tracing != nil {
				t.Errorf("tracing %+v, want off", c.Tracing)
			}
			if c.Events.QPS != 5 || c.Events.Burst != 25 || c.Events.SandboxHeldAfter.Duration != 5*time.Second {
				t.Errorf("events %+v", c.Events)
			}
			p := c.ImagePulls
			if p.WaitEventAfter.Duration != 5*time.Second || p.ProgressEventAfter.Duration != 30*time.Second ||
				p.ProgressEventInterval.Duration != 30*time.Second || p.ContainerdNamespace != "k8s.io" {
				t.Errorf("imagePulls %+v", p)
			}
			if got := c.ContainerdSocket(); got != "/run/containerd/containerd.sock" {
				t.Errorf("containerd socket %q, want the runtime endpoint's", got)
			}
		}},
		{name: "containerd socket from the image endpoint", doc: "imageEndpoint: unix:///run/img/containerd.sock", check: func(t *testing.T, c *Configuration) {
			if got := c.ContainerdSocket(); got != "/run/img/containerd.sock" {
				t.Errorf("containerd socket %q, want the image endpoint's", got)
			}
		}},
		{name: "progress off", doc: `imagePulls: {containerdAddress: ""}`, check: func(t *testing.T, c *Configuration) {
			if got := c.ContainerdSocket(); got != "" {
				t.Errorf("containerd socket %q, want none", got)
			}
		}},
		{name: "tracing, kubelet's defaults", doc: "tracing: {}", check: func(t *testing.T, c *Configuration) {
			if c.Tracing == nil || c.Tracing.Endpoint != "localhost:4317" || *c.Tracing.SamplingRatePerMillion != 0 {
				t.Errorf("tracing %+v", c.Tracing)
			}
		}},
		{name: "tracing to a named collector", doc: "tracing: {endpoint: otel-collector.monitoring:4317, samplingRatePerMillion: 1000000}"},
		{name: "bad tracing", doc: "tracing: {endpoint: nohost, samplingRatePerMillion: 1000001}",
			wantErr: []string{`tracing.endpoint: "nohost": want host:port`, "tracing.samplingRatePerMillion: 1000001: want 0 to 1000000"}},
		{name: "bad thresholds", doc: "imagePulls: {waitEventAfter: 10ms, progressEventInterval: 0.5s}\nevents: {sandboxHeldAfter: 1ms, qps: -1}",
			wantErr: []string{"imagePulls.waitEventAfter: 10ms: must be at least 1s", "imagePulls.progressEventInterval: 500ms", "events.sandboxHeldAfter: 1ms", "events.qps: -1"}},
		{name: "bad containerd address", doc: `imagePulls: {containerdAddress: "tcp://1.2.3.4:1"}`, wantErr: []string{"imagePulls.containerdAddress"}},
		{name: "misspelt tracing key", doc: "tracing: {samplingRatePerMilion: 5}", wantErr: []string{`"samplingRatePerMilion"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n" + tt.doc))
			if err == nil {
				err = c.Validate()
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				if tt.check != nil {
					tt.check(t, c)
				}
				return
			}
			for _, want := range tt.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("error %v, want %q", err, want)
				}
			}
		})
	}
}

package config

import (
	"strings"
	"testing"
	"time"
)

// TestPullCoolDownConfig: imagePulls.coolDown's defaults, retryFor 0 turning it off, and what
// is refused, each error naming the key.
func TestPullCoolDownConfig(t *testing.T) {
	tests := []struct {
		name                     string
		doc                      string
		initial, maxDelay, retry time.Duration
		wantError                []string
	}{
		{name: "defaults", doc: "", initial: time.Second, maxDelay: 2 * time.Minute, retry: 5 * time.Minute},
		{name: "off", doc: "imagePulls: {coolDown: {retryFor: 0s}}", initial: time.Second, maxDelay: 2 * time.Minute, retry: 0},
		{name: "set", doc: "imagePulls: {coolDown: {initialDelay: 500ms, maxDelay: 30s, retryFor: 10m}}", initial: 500 * time.Millisecond, maxDelay: 30 * time.Second, retry: 10 * time.Minute},
		{name: "too short", doc: "imagePulls: {coolDown: {initialDelay: 10ms, maxDelay: 50ms}}", wantError: []string{
			"imagePulls.coolDown.initialDelay: 10ms: must be at least 100ms",
			"imagePulls.coolDown.maxDelay: 50ms: must be at least 100ms"}},
		{name: "cap below start", doc: "imagePulls: {coolDown: {initialDelay: 5m}}", wantError: []string{
			"imagePulls.coolDown.maxDelay: 2m0s: must not be below initialDelay 5m0s"}},
		{name: "hold shorter than the first cool-down", doc: "imagePulls: {coolDown: {initialDelay: 10s, retryFor: 5s}}", initial: 10 * time.Second, maxDelay: 2 * time.Minute, retry: 5 * time.Second},
		{name: "negative retry", doc: "imagePulls: {coolDown: {retryFor: -1m}}", wantError: []string{
			"imagePulls.coolDown.retryFor: -1m0s: must not be negative (0 turns cool-downs off)"}},
		{name: "not a duration", doc: "imagePulls: {coolDown: {maxDelay: 2 minutes}}", wantError: []string{"imagePulls.coolDown.maxDelay"}},
		{name: "misspelt key", doc: "imagePulls: {coolDown: {retryfor: 1m}}", wantError: []string{`"retryfor"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse([]byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n" + tt.doc))
			if err == nil {
				err = c.Validate()
			}
			if len(tt.wantError) > 0 {
				for _, want := range tt.wantError {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("error %v, want %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if i, m, r := c.ImagePulls.CoolDown.Durations(); i != tt.initial || m != tt.maxDelay || r != tt.retry {
				t.Errorf("cool-down %s, %s, %s; want %s, %s, %s", i, m, r, tt.initial, tt.maxDelay, tt.retry)
			}
		})
	}
}

// TestRegistryRateConfig: imagePulls.perRegistryRate's burst defaults to 1; pulls, interval
// and burst are checked, each error naming the host and the key.
func TestRegistryRateConfig(t *testing.T) {
	c, err := Parse([]byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\nimagePulls:\n  perRegistryRate:\n    docker.io: {pulls: 100, interval: 6h}\n    quay.io: {pulls: 10, interval: 1s, burst: 5}\n"))
	if err == nil {
		err = c.Validate()
	}
	if err != nil {
		t.Fatal(err)
	}
	if r := c.ImagePulls.PerRegistryRate["docker.io"]; r.Pulls != 100 || r.Interval.Duration != 6*time.Hour || r.Burst == nil || *r.Burst != 1 {
		t.Errorf("docker.io's rate %+v, want 100 per 6h, burst 1", r)
	}
	if r := c.ImagePulls.PerRegistryRate["quay.io"]; *r.Burst != 5 {
		t.Errorf("quay.io's burst %d, want 5", *r.Burst)
	}
	c, err = Parse([]byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\nimagePulls:\n  perRegistryRate:\n    a.io: {pulls: 0, interval: 500ms, burst: 0}\n    b.io: {pulls: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	for _, want := range []string{
		`imagePulls.perRegistryRate["a.io"].pulls: must be positive, got 0`,
		`imagePulls.perRegistryRate["a.io"].interval: 500ms: must be at least 1s`,
		`imagePulls.perRegistryRate["a.io"].burst: must be positive, got 0`,
		`imagePulls.perRegistryRate["b.io"].interval: 0s: must be at least 1s`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want %q", err, want)
		}
	}
	if _, err := Parse([]byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\nimagePulls: {perRegistryRate: {a.io: {pulls: 1, interval: 1s, brust: 2}}}\n")); err == nil || !strings.Contains(err.Error(), `"brust"`) {
		t.Errorf("misspelt key: %v, want it refused", err)
	}
}

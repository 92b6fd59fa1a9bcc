package config

import (
	"strings"
	"testing"
	"time"
)

// TestPullStallConfig: imagePulls.stall's defaults, 0 turning it off, and what is refused,
// each error naming the key.
func TestPullStallConfig(t *testing.T) {
	tests := []struct {
		name      string
		doc       string
		wantMin   int64
		wantWin   time.Duration
		wantError []string
	}{
		{name: "defaults", doc: "", wantMin: 8192, wantWin: 10 * time.Minute},
		{name: "off", doc: "imagePulls: {stall: {minBytesPerSecond: 0}}", wantMin: 0, wantWin: 10 * time.Minute},
		{name: "set", doc: "imagePulls: {stall: {minBytesPerSecond: 4096, window: 3s}}", wantMin: 4096, wantWin: 3 * time.Second},
		{name: "negative rate and short window", doc: "imagePulls: {stall: {minBytesPerSecond: -1, window: 1500ms}}", wantError: []string{
			"imagePulls.stall.minBytesPerSecond: must not be negative, got -1 (0 turns stall detection off)",
			"imagePulls.stall.window: 1.5s: must be at least 2s (the content store is read once a second)"}},
		{name: "not a duration", doc: "imagePulls: {stall: {window: 5 minutes}}", wantError: []string{"imagePulls.stall.window"}},
		{name: "misspelt key", doc: "imagePulls: {stall: {minBytesPerSec: 10}}", wantError: []string{`"minBytesPerSec"`}},
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
			if minRate, window := c.ImagePulls.Stall.Rule(); minRate != tt.wantMin || window != tt.wantWin {
				t.Errorf("stall %d B/s over %s, want %d over %s", minRate, window, tt.wantMin, tt.wantWin)
			}
		})
	}
}

package kube

import (
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// TestClientSharesOneRateLimiter: kubeAPIQPS and kubeAPIBurst bound all of podgate's requests,
// so the REST clients of every API group take their tokens from one bucket of that rate.
func TestClientSharesOneRateLimiter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		qps     float32
		burst   int
		wantQPS float32
	}{
		{name: "configured", qps: 7, burst: 3, wantQPS: 7},
		{name: "client-go's defaults", wantQPS: rest.DefaultQPS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &rest.Config{Host: "https://127.0.0.1:6443"}
			WithRateLimit(tc.qps, tc.burst)(cfg)
			c, err := newClientForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var limiters []flowcontrol.RateLimiter
			for name, rc := range map[string]rest.Interface{"core": c.core, "resource.k8s.io": c.resource, "events.k8s.io": c.events} {
				l := rc.GetRateLimiter()
				if l == nil {
					t.Fatalf("the %s client has no rate limiter", name)
				}
				if l.QPS() != tc.wantQPS {
					t.Errorf("the %s client's limiter: %v QPS, want %v", name, l.QPS(), tc.wantQPS)
				}
				limiters = append(limiters, l)
			}
			for _, l := range limiters[1:] {
				if l != limiters[0] {
					t.Fatal("the API groups' clients have token buckets of their own: kubeAPIQPS would bound each group, not podgate")
				}
			}
			if cfg.RateLimiter != nil {
				t.Error("the caller's config was changed")
			}
		})
	}
}

package agent

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
)

// The profiling pages are served only when enableProfilingHandler is set; /metrics is served
// either way.
func TestProfilingHandler(t *testing.T) {
	for _, tc := range []struct {
		name      string
		config    string
		wantPprof int
	}{
		{"default", "", http.StatusNotFound},
		{"off", "enableProfilingHandler: false\n", http.StatusNotFound},
		{"on", "enableProfilingHandler: true\n", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n" + tc.config))
			if err != nil {
				t.Fatal(err)
			}
			h := New(cfg, "test").httpHandler(nil) // no /readyz call here, so no CRI server
			for _, path := range []string{"/debug/pprof/", "/debug/pprof/goroutine?debug=1", "/debug/pprof/cmdline", "/debug/pprof/symbol"} {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != tc.wantPprof {
					t.Errorf("GET %s: %d, want %d", path, rec.Code, tc.wantPprof)
				}
				if tc.wantPprof == http.StatusOK && path == "/debug/pprof/goroutine?debug=1" && !strings.Contains(rec.Body.String(), "goroutine profile:") {
					t.Errorf("GET %s: body %.200q, want a goroutine profile", path, rec.Body.String())
				}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
			if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "podgate_build_info") {
				t.Errorf("GET /metrics: %d %.200q, want 200 with podgate_build_info", rec.Code, rec.Body.String())
			}
		})
	}
}

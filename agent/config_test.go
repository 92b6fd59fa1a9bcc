package agent

import (
	"strings"
	"testing"
)

const header = "apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"

func TestParseIsStrict(t *testing.T) {
	_, err := Parse([]byte(header + "critSocket: /run/podgate/cri.sock\n"))
	if err == nil || !strings.Contains(err.Error(), `"critSocket"`) {
		t.Fatalf("misspelt key: got %v, want an error naming critSocket", err)
	}
	_, err = Parse([]byte(header + "logging: {format: json, verbosty: 2}\n"))
	if err == nil || !strings.Contains(err.Error(), `"verbosty"`) {
		t.Fatalf("misspelt nested key: got %v, want an error naming verbosty", err)
	}
}

func TestParseChecksKind(t *testing.T) {
	for _, doc := range []string{
		"kind: AgentConfiguration\n",
		"apiVersion: podgate.dev/v1alpha1\nkind: KubeletConfiguration\n",
		"apiVersion: podgate.dev/v2\nkind: AgentConfiguration\n",
	} {
		if _, err := Parse([]byte(doc)); err == nil || !strings.Contains(err.Error(), "apiVersion/kind") {
			t.Errorf("%q: got %v, want an apiVersion/kind error", doc, err)
		}
	}
}

func TestParseDefaultsAndValues(t *testing.T) {
	c, err := Parse([]byte(header + "imageEndpoint: /run/images.sock\nshutdownGracePeriod: 3s\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.CRISocket != DefaultCRISocket || c.RuntimeEndpoint != DefaultRuntimeEndpoint || c.StateDir != DefaultStateDir {
		t.Errorf("defaults not applied: %+v", c)
	}
	if !c.MetricsEnabled() || *c.MetricsAddress != DefaultMetricsAddress {
		t.Errorf("metrics address %v, want the default on", c.MetricsAddress)
	}
	if c.ImageBackend() != "/run/images.sock" || c.ShutdownGracePeriod.Seconds() != 3 {
		t.Errorf("values not read: image %q grace %v", c.ImageBackend(), c.ShutdownGracePeriod)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("valid file: %v", err)
	}
	for _, off := range []string{`""`, `"0"`} {
		c, err := Parse([]byte(header + "metricsAddress: " + off + "\n"))
		if err != nil {
			t.Fatal(err)
		}
		if c.MetricsEnabled() {
			t.Errorf("metricsAddress %s: listener still enabled", off)
		}
	}
}

func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		doc, field string
	}{
		{"criSocket: relative/cri.sock", "criSocket:"},
		{"criSocket: /" + strings.Repeat("x", 120), "criSocket:"},
		{"runtimeEndpoint: tcp://10.0.0.1:1234", "runtimeEndpoint:"},
		{"runtimeEndpoint: unix://relative.sock", "runtimeEndpoint:"},
		{"imageEndpoint: images.sock", "imageEndpoint:"},
		{"criSocket: /run/x.sock\nruntimeEndpoint: unix:///run/x.sock", "forward to itself"},
		{"criSocket: /run/x.sock\nimageEndpoint: unix:///run//x.sock", "imageEndpoint: \"unix:///run//x.sock\" is podgate's own"},
		{"metricsAddress: localhost", "metricsAddress:"},
		{"metricsAddress: example.com:9743", "metricsAddress:"},
		{"stateDir: var/lib/podgate", "stateDir:"},
		{"shutdownGracePeriod: -1s", "shutdownGracePeriod:"},
		{"logging: {format: xml}", "logging.format:"},
		{"logging: {verbosity: -1}", "logging.verbosity:"},
	} {
		c, err := Parse([]byte(header + tc.doc + "\n"))
		if err != nil {
			t.Errorf("%q: parse: %v", tc.doc, err)
			continue
		}
		err = c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%q: got %v, want an error with %q", tc.doc, err, tc.field)
		}
	}
}

func TestValidateReportsEveryBadField(t *testing.T) {
	c, err := Parse([]byte(header + "criSocket: a\nstateDir: b\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = c.Validate()
	if err == nil || !strings.Contains(err.Error(), "criSocket:") || !strings.Contains(err.Error(), "stateDir:") {
		t.Fatalf("got %v, want both fields named", err)
	}
}

func TestParseBadDuration(t *testing.T) {
	if _, err := Parse([]byte(header + "shutdownGracePeriod: soon\n")); err == nil {
		t.Fatal("shutdownGracePeriod: soon accepted")
	}
}

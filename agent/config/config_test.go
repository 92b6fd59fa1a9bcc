package config

import (
	"os"
	"path/filepath"
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
		{"metricsAddress: \"\"\nenableProfilingHandler: true", "enableProfilingHandler:"},
		{"stateDir: var/lib/podgate", "stateDir:"},
		{"shutdownGracePeriod: -1s", "shutdownGracePeriod:"},
		{"logging: {format: xml}", "logging.format:"},
		{"logging: {verbosity: -1}", "logging.verbosity:"},
		{"kubeletPodsAPISocket: pods-api.sock", "kubeletPodsAPISocket: \"pods-api.sock\": want an absolute path"},
		{"kubeletPodsAPISocket: /" + strings.Repeat("x", 120), "kubeletPodsAPISocket:"},
		{"criSocket: /run/x.sock\nkubeletPodsAPISocket: /run//x.sock", "kubeletPodsAPISocket: \"/run//x.sock\" is podgate's own criSocket"},
		{"kubeletPodsAPISocket: /var/lib/kubelet/pod-resources/podgate.sock", "is podgate's own podResources.socket"},
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

func TestParseErrorsNamePathAndLine(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      []string // each must be in the error
	}{
		{
			name: "unknown nested key",
			doc:  "criSocket: /run/podgate/cri.sock\nlogging:\n  format: json\nimagePulls:\n  maxParalel: 3\n",
			want: []string{`imagePulls.maxParalel: unknown field "maxParalel" (line 7)`},
		},
		{name: "wrong case at top level", doc: "crisocket: /run/podgate/cri.sock\n", want: []string{`crisocket: unknown field "crisocket" (line 3)`}},
		{name: "wrong case nested", doc: "imagePulls: {maxparallel: 3}\n", want: []string{`imagePulls.maxparallel: unknown field "maxparallel" (line 3)`}},
		{name: "wrong case kind", doc: "Kind: AgentConfiguration\n", want: []string{`Kind: unknown field "Kind" (line 3)`}},
		{
			name: "every unknown key",
			doc:  "stateDr: /x\nsysctls:\n  nodes: {}\n",
			want: []string{`stateDr: unknown field "stateDr" (line 3)`, `sysctls.nodes: unknown field "nodes" (line 5)`},
		},
		{name: "string for an int", doc: "imagePulls:\n  maxParallel: lots\n", want: []string{"imagePulls.maxParallel: cannot decode string into int32 (line 4)"}},
		{name: "list item of the wrong type", doc: "dra:\n  drivers:\n  - a.example.com\n  - [b]\n", want: []string{"dra.drivers[1]: cannot decode array into string (line 6)"}},
		{name: "scalar for a section", doc: "\nlogging: loud\n", want: []string{"logging: cannot decode string into config.Logging (line 4)"}},
		{name: "bad duration", doc: "dra:\n  callTimeout: soon\n", want: []string{`dra.callTimeout: time: invalid duration "soon" (line 4)`}},
		{name: "duplicate key", doc: "stateDir: /a\nstateDir: /b\n", want: []string{`stateDir: duplicate key "stateDir" (line 4, first at line 3)`}},
		{
			name: "duplicate nested key",
			doc:  "imagePulls:\n  perRegistry:\n    docker.io: 1\n    docker.io: 2\n",
			want: []string{`imagePulls.perRegistry.docker.io: duplicate key "docker.io" (line 6, first at line 5)`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(header + tc.doc))
			if err == nil {
				t.Fatalf("accepted, want %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			for _, noise := range []string{"JSON", "json:", "unmarshal"} {
				if strings.Contains(err.Error(), noise) {
					t.Errorf("error %q speaks of %q, not of the file", err, noise)
				}
			}
		})
	}
}

func TestParseKeepsValuesAsWritten(t *testing.T) {
	c, err := Parse([]byte(header + "nodeName: \"2024-01-02\"\nkubeconfig: 2024-01-02\nimagePulls: {maxParallel: 2, perRegistry: {\"docker.io\": 1}}\nlogging:\n  verbosity: 4\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "2024-01-02" || c.Kubeconfig != "2024-01-02" || *c.ImagePulls.MaxParallel != 2 || c.ImagePulls.PerRegistry["docker.io"] != 1 || c.Logging.Verbosity != 4 {
		t.Errorf("values not read as written: %+v", c)
	}
	if _, err := Parse(nil); err == nil || !strings.Contains(err.Error(), "apiVersion/kind") {
		t.Errorf("empty document: got %v, want an apiVersion/kind error", err)
	}
	if _, err := Parse([]byte(header + "criSocket: [unclosed\n")); err == nil || !strings.Contains(err.Error(), "line ") {
		t.Errorf("YAML syntax error: got %v, want its line", err)
	}
}

func TestLoadFileNamesTheFileOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(header+"imagePulls:\n  maxParalel: 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path)
	want := path + `: imagePulls.maxParalel: unknown field "maxParalel" (line 4)`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	if n := strings.Count(err.Error(), path); n != 1 {
		t.Errorf("%q names the file %d times, want once", err, n)
	}
}

func TestKubeAPILimits(t *testing.T) {
	c := DefaultConfiguration()
	if *c.KubeAPIQPS != DefaultKubeAPIQPS || *c.KubeAPIBurst != DefaultKubeAPIBurst {
		t.Errorf("defaults %v/%v, want %v/%v", *c.KubeAPIQPS, *c.KubeAPIBurst, DefaultKubeAPIQPS, DefaultKubeAPIBurst)
	}
	zero, none := float32(0), int32(0)
	c.KubeAPIQPS, c.KubeAPIBurst = &zero, &none
	err := c.Validate()
	for _, want := range []string{"kubeAPIQPS: 0: must be above 0", "kubeAPIBurst: 0: must be at least 1"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want %q", err, want)
		}
	}
}

// TestKubeletPodsAPISocket: unset is the kubelet's default socket, "" is off (the API server),
// and both validate.
func TestKubeletPodsAPISocket(t *testing.T) {
	for doc, want := range map[string]string{
		"":                             DefaultKubeletPodsAPISocket,
		"kubeletPodsAPISocket: \"\"\n": "",
		"kubeletPodsAPISocket: /srv/kubelet/pods-api/pods-api.sock\n": "/srv/kubelet/pods-api/pods-api.sock",
	} {
		c, err := Parse([]byte(header + doc))
		if err != nil {
			t.Fatalf("%q: %v", doc, err)
		}
		if got := *c.KubeletPodsAPISocket; got != want {
			t.Errorf("%q: kubeletPodsAPISocket %q, want %q", doc, got, want)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v", doc, err)
		}
	}
}

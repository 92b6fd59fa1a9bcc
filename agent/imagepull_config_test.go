package agent

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri/imagepull"
)

// configHeader starts a configuration file.
const configHeader = "apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"

// TestImagePullsConfig: Validate checks the imagePulls section by config's rules and the
// feature's (registry hosts), reporting both; the agent hands the feature its caps with the
// registry hosts normalised. Each rule is tested where it is written.
func TestImagePullsConfig(t *testing.T) {
	c, err := config.Parse([]byte(configHeader + `imagePulls: {maxParallel: 0, perRegistry: {"a/b": 1}, perRegistryRate: {"x/y": {pulls: 1, interval: 1s}, "docker.io": {pulls: 1, interval: 1s}, "index.docker.io": {pulls: 2, interval: 1s}}, coolDown: {retryFor: -1s}}` + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	err = Validate(c)
	for _, w := range []string{"imagePulls.maxParallel: must be positive", `imagePulls.perRegistry["a/b"]`, `imagePulls.perRegistryRate["x/y"]: not a registry host`,
		`imagePulls.perRegistryRate["index.docker.io"]: the same registry as "docker.io"`, "imagePulls.coolDown.retryFor: -1s"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Validate: %v, want an error with %q", err, w)
		}
	}
	for _, tt := range []struct {
		doc  string
		want imagepull.Limits
	}{
		{"", imagepull.Limits{}},
		{"imagePulls: {maxParallel: 1}", imagepull.Limits{MaxParallel: 1}},
		{`imagePulls: {maxParallel: 3, perRegistry: {"index.docker.io": 2, "Quay.io": 1, "127.0.0.1:5000": 4}}`,
			imagepull.Limits{MaxParallel: 3, PerRegistry: map[string]int{"docker.io": 2, "quay.io": 1, "127.0.0.1:5000": 4}}},
		{`imagePulls: {perRegistryRate: {"Index.Docker.io": {pulls: 100, interval: 6h}, "quay.io": {pulls: 5, interval: 1s, burst: 5}}}`,
			imagepull.Limits{PerRegistryRate: map[string]imagepull.Rate{"docker.io": {Pulls: 100, Interval: 6 * time.Hour, Burst: 1}, "quay.io": {Pulls: 5, Interval: time.Second, Burst: 5}}}},
	} {
		c, err := config.Parse([]byte(configHeader + tt.doc + "\n"))
		if err == nil {
			err = Validate(c)
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.doc, err)
		}
		if got := pullLimits(&c.ImagePulls); got.MaxParallel != tt.want.MaxParallel || !maps.Equal(got.PerRegistry, tt.want.PerRegistry) ||
			!maps.Equal(got.PerRegistryRate, tt.want.PerRegistryRate) {
			t.Errorf("%s: limits %+v, want %+v", tt.doc, got, tt.want)
		}
	}
}

func TestImagePullsDefaults(t *testing.T) {
	c, err := config.Parse([]byte(configHeader))
	if err != nil {
		t.Fatal(err)
	}
	sp := sandboxPriority(&c.ImagePulls)
	if sp.Label != config.DefaultPriorityLabel || len(sp.Namespaces) != 1 || sp.Namespaces[0] != "kube-system" {
		t.Errorf("priority fallback %+v, want %s in kube-system", sp, config.DefaultPriorityLabel)
	}
	c, err = config.Parse([]byte(configHeader + "imagePulls: {priorityNamespaces: []}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := c.ImagePulls.PriorityNamespaces; n == nil || len(n) != 0 {
		t.Errorf("priorityNamespaces: [] became %v, want it kept empty (fallback off)", n)
	}
}

// TestImagePullsCoolDown: the agent hands the feature imagePulls.coolDown as the file says,
// the defaults when it says nothing, and retryFor 0 as off.
func TestImagePullsCoolDown(t *testing.T) {
	for _, tt := range []struct {
		doc  string
		want imagepull.CoolDown
	}{
		{"", imagepull.CoolDown{InitialDelay: time.Second, MaxDelay: 2 * time.Minute, RetryFor: 5 * time.Minute}},
		{"imagePulls: {coolDown: {initialDelay: 2s, maxDelay: 1m, retryFor: 3m}}", imagepull.CoolDown{InitialDelay: 2 * time.Second, MaxDelay: time.Minute, RetryFor: 3 * time.Minute}},
		{"imagePulls: {coolDown: {retryFor: 0s}}", imagepull.CoolDown{InitialDelay: time.Second, MaxDelay: 2 * time.Minute}},
	} {
		c, err := config.Parse([]byte(configHeader + tt.doc + "\n"))
		if err == nil {
			err = Validate(c)
		}
		if err != nil {
			t.Fatalf("%s: %v", tt.doc, err)
		}
		if got := coolDown(&c.ImagePulls); got != tt.want || got.On() != (tt.want.RetryFor > 0) {
			t.Errorf("%s: cool-down %+v, want %+v", tt.doc, got, tt.want)
		}
	}
}

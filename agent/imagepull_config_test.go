package agent

import (
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
	"github.com/podgate/podgate/cri/imagepull"
)

// configHeader starts a configuration file.
const configHeader = "apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\n"

func TestImagePullsConfig(t *testing.T) {
	tests := []struct {
		name    string
		doc     string
		wantErr []string // substrings of the error; none = valid
		want    imagepull.Limits
	}{
		{name: "unset is unlimited", doc: ""},
		{name: "serial", doc: "imagePulls: {maxParallel: 1}", want: imagepull.Limits{MaxParallel: 1}},
		{
			name: "per registry, docker.io normalised",
			doc:  `imagePulls: {maxParallel: 3, perRegistry: {"index.docker.io": 2, "Quay.io": 1, "127.0.0.1:5000": 4}}`,
			want: imagepull.Limits{MaxParallel: 3, PerRegistry: map[string]int{"docker.io": 2, "quay.io": 1, "127.0.0.1:5000": 4}},
		},
		{name: "zero", doc: "imagePulls: {maxParallel: 0}", wantErr: []string{"imagePulls.maxParallel: must be positive"}},
		{name: "negative", doc: "imagePulls: {maxParallel: -2}", wantErr: []string{"imagePulls.maxParallel: must be positive, got -2"}},
		{
			name:    "bad registry values",
			doc:     `imagePulls: {perRegistry: {"docker.io": 0, "a/b": 1, "": 1}}`,
			wantErr: []string{`imagePulls.perRegistry["docker.io"]: must be positive`, `imagePulls.perRegistry["a/b"]`, `imagePulls.perRegistry[""]: empty registry host`},
		},
		{
			name:    "aliases of one registry",
			doc:     `imagePulls: {perRegistry: {"docker.io": 1, "index.docker.io": 2}}`,
			wantErr: []string{`imagePulls.perRegistry["index.docker.io"]: the same registry as "docker.io"`},
		},
		{name: "bad priority label", doc: `imagePulls: {priorityLabel: "not a label"}`, wantErr: []string{"imagePulls.priorityLabel"}},
		{name: "bad priority namespace", doc: `imagePulls: {priorityNamespaces: [Kube_System]}`, wantErr: []string{"imagePulls.priorityNamespaces[0]"}},
		{name: "misspelt key", doc: "imagePulls: {maxParalel: 2}", wantErr: []string{`"maxParalel"`}},
		{name: "bad node name", doc: "nodeName: Node_1", wantErr: []string{`nodeName: "Node_1"`}},
		{name: "kubeconfig and node", doc: "kubeconfig: /etc/podgate/kubeconfig\nnodeName: node-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := config.Parse([]byte(configHeader + tt.doc + "\n"))
			if err == nil {
				err = Validate(c)
			}
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("valid config: %v", err)
				}
				got := pullLimits(&c.ImagePulls)
				if got.MaxParallel != tt.want.MaxParallel || len(got.PerRegistry) != len(tt.want.PerRegistry) {
					t.Errorf("limits %+v, want %+v", got, tt.want)
				}
				for h, v := range tt.want.PerRegistry {
					if got.PerRegistry[h] != v {
						t.Errorf("perRegistry[%s] = %d, want %d", h, got.PerRegistry[h], v)
					}
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted, want errors %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
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

package agent

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is podgate's module path.
const module = "github.com/podgate/podgate"

// features are the packages (with everything under them) that own one concern each. A feature
// may use the shared infrastructure (pipeline, cri, agent/registry, agent/kube) but no other
// feature: what two features share goes to the infrastructure, and agent wires them together.
var features = []string{"sysctl", "dra", "resources", "cri/imagepull", "podresources"}

// leaves may import no feature at all: the infrastructure every feature builds on, and the
// configuration and registry that agent composes features' parts into, and the description of
// the node's kubelet that agent decides each feature's share from.
var leaves = []string{"pipeline", "cri", "cri/relay", "cri/endpoint", "agent/config", "agent/registry", "agent/kubeletinfo"}

// TestImportGraph holds the house's rooms to their rule: no package imports agent but the
// command and the real-stack tests; no feature imports another feature; the infrastructure
// imports no feature.
func TestImportGraph(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module+"/")
		for _, imp := range f[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	if len(graph) < 10 {
		t.Fatalf("go list found %d packages with podgate imports: %v", len(graph), graph)
	}
	for pkg, imports := range graph {
		for _, imp := range imports {
			if why := forbidden(pkg, imp); why != "" {
				t.Errorf("%s imports %s: %s", pkg, imp, why)
			}
		}
	}
}

// forbidden says why pkg may not import imp; "" when it may.
func forbidden(pkg, imp string) string {
	switch {
	case imp == "agent" && pkg != "cmd/podgate" && !under(pkg, "test"):
		return "only the command and the real-stack tests use the composition root"
	case slices.Contains(leaves, pkg) && featureOf(imp) != "":
		return "the infrastructure and agent's config and registry import no feature (" + featureOf(imp) + ")"
	case featureOf(pkg) != "" && featureOf(imp) != "" && featureOf(pkg) != featureOf(imp):
		return "a feature imports no other feature (" + featureOf(imp) + "); share through the infrastructure or let agent wire them"
	}
	return ""
}

// featureOf is the feature pkg belongs to, "" for none.
func featureOf(pkg string) string {
	if under(pkg, "podresources/api") {
		return "" // the extension's wire API (generated messages), which features fill in
	}
	// The longest match wins: cri/imagepull is a feature, cri is not.
	best := ""
	for _, f := range features {
		if under(pkg, f) && len(f) > len(best) {
			best = f
		}
	}
	return best
}

func under(pkg, dir string) bool { return pkg == dir || strings.HasPrefix(pkg, dir+"/") }

// TestForbidden: the rule says no where it must and yes where it may.
func TestForbidden(t *testing.T) {
	for _, tc := range []struct {
		pkg, imp string
		ok       bool
	}{
		{"sysctl", "agent", false},
		{"cmd/podgate", "agent", true},
		{"test/e2e", "agent", true},
		{"sysctl", "dra", false},
		{"dra/manager", "dra", true},
		{"dra/manager", "resources/cgroup", false},
		{"cri/imagepull", "cri", true},
		{"cri", "cri/imagepull", false},
		{"agent/registry", "dra", false},
		{"agent/config", "sysctl", false},
		{"agent/config", "agent/kube", true},
		{"agent", "dra", true},
		{"podresources", "pipeline", true},
		{"cri/imagepull", "podresources/api/v1alpha1", true},
		{"cri/imagepull", "podresources", false},
	} {
		if got := forbidden(tc.pkg, tc.imp) == ""; got != tc.ok {
			t.Errorf("%s importing %s allowed = %v, want %v (%s)", tc.pkg, tc.imp, got, tc.ok, forbidden(tc.pkg, tc.imp))
		}
	}
}

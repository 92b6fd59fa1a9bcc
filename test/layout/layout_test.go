package layout

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// module is podgate's module path.
const module = "github.com/podgate/podgate"

// topLevel is the project card's top level: every folder of the repository is one of these or
// lies under one.
var topLevel = []string{"agent", "cri", "dra", "podresources", "sysctl", "cmd", "test", "deploy", "docs"}

// features are the packages (with everything under them) that own one concern each. A feature
// may use the kernel (cri, cri/pipeline, cri/registry) but no other feature's packages, its API
// packages included (podresources/api: the PodResources extension's messages are made by the
// adapter between the features and the service, agent/podview), and nothing of agent's: what two
// features share goes to the kernel, and agent wires them together, passing each the adapters
// (agent/kube, agent/podview) behind the narrow interfaces the feature declares.
var features = []string{"sysctl", "dra", "podresources", "cri/imagepull"}

// kernel is what every feature builds on: the CRI proxy and what podgate keeps of the CRI (the
// sandbox pipeline, the pod registry). It imports nothing of podgate's but itself.
var kernel = []string{"cri", "cri/relay", "cri/endpoint", "cri/pipeline", "cri/registry"}

// agentLeaves are agent's parts that features' values pass through and that import no feature:
// the configuration (each feature validates its own section, composed by agent), the Kubernetes
// adapter and the description of the node's kubelet.
var agentLeaves = []string{"agent/config", "agent/kube", "agent/kubeletinfo", "agent/compat", "agent/tracing"}

// importGraph is every package's podgate imports, its tests' included, by path below module.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}",
		module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	graph := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		pkg := relative(f[0])
		graph[pkg] = nil
		for _, imp := range f[1:] {
			if rel, ok := strings.CutPrefix(imp, module+"/"); ok && !slices.Contains(graph[pkg], rel) && rel != pkg {
				graph[pkg] = append(graph[pkg], rel)
			}
		}
	}
	if len(graph) < 20 {
		t.Fatalf("go list found %d packages: %v", len(graph), graph)
	}
	return graph
}

func relative(pkg string) string {
	if pkg == module {
		return ""
	}
	return strings.TrimPrefix(pkg, module+"/")
}

// TestImportGraph holds the house's rooms to their rules (forbidden).
func TestImportGraph(t *testing.T) {
	for pkg, imports := range importGraph(t) {
		if top := strings.Split(pkg, "/")[0]; !slices.Contains(topLevel, top) {
			t.Errorf("package %s: top-level folder %q is not one of the card's %v", pkg, top, topLevel)
		}
		for _, imp := range imports {
			if why := forbidden(pkg, imp); why != "" {
				t.Errorf("%s imports %s: %s", pkg, imp, why)
			}
		}
	}
}

// TestTopLevel: the repository's folders are the card's (the packages are checked above; this
// catches folders of scripts, data or stray binaries).
func TestTopLevel(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	seen := map[string]bool{}
	for line := range strings.Lines(string(out)) {
		first, rest, dir := strings.Cut(strings.TrimSpace(line), "/")
		if !dir || rest == "" || strings.HasPrefix(first, ".") || seen[first] {
			continue
		}
		seen[first] = true
		if !slices.Contains(topLevel, first) {
			t.Errorf("folder %s/ is not one of the card's top level %v", first, topLevel)
		}
	}
}

// forbidden says why pkg may not import imp; "" when it may.
func forbidden(pkg, imp string) string {
	switch {
	case under(imp, "agent") && !under(pkg, "agent") && !under(pkg, "cmd"):
		return "nothing outside agent/ and cmd/ imports the composition root or its parts"
	case slices.Contains(kernel, pkg) && !slices.Contains(kernel, imp) && !under(imp, "test"):
		return "the kernel imports nothing of podgate's but the kernel"
	case slices.Contains(agentLeaves, pkg) && featureOf(imp) != "":
		return "agent's config, Kubernetes adapter and kubelet view import no feature (" + featureOf(imp) + "); the feature declares the interface, agent passes the adapter"
	case featureOf(pkg) != "" && featureOf(imp) != "" && featureOf(pkg) != featureOf(imp):
		return "a feature imports no other feature (" + featureOf(imp) + "); share through the kernel or let agent wire them"
	}
	return ""
}

// featureOf is the feature pkg belongs to, "" for none.
func featureOf(pkg string) string {
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
		{"sysctl", "agent/registry", false},
		{"dra/manager", "agent/kube", false},
		{"test/e2e", "agent/kube", false},
		{"cmd/podgate", "agent", true},
		{"cmd/podgate", "agent/config", true},
		{"agent", "agent/kube", true},
		{"sysctl", "dra", false},
		{"dra/manager", "dra", true},
		{"dra/manager", "podresources/cgroup", false},
		{"cri/imagepull", "cri", true},
		{"cri/imagepull", "cri/registry", true},
		{"cri", "cri/imagepull", false},
		{"cri/pipeline", "cri/registry", true},
		{"cri/registry", "dra", false},
		{"cri/registry", "agent/config", false},
		{"cri/pipeline", "test/crifixture", true},
		{"agent/config", "sysctl", false},
		{"agent/kube", "dra", false},
		{"agent/config", "agent/kube", true},
		{"agent", "dra", true},
		{"podresources/resources", "podresources/cgroup", true},
		{"podresources", "cri/pipeline", true},
		{"cri/imagepull", "podresources/api/v1alpha1", false},
		{"cri/imagepull/progress", "podresources/api/v1alpha1", false},
		{"dra/manager", "podresources/api/v1alpha1", false},
		{"sysctl", "cri/imagepull/progress", false},
		{"cri/imagepull", "podresources", false},
		{"podresources/resources", "podresources/api/v1alpha1", true},
		{"podresources", "podresources/api/v1alpha1", true},
		{"agent/podview", "podresources/api/v1alpha1", true},
		{"test/e2e", "podresources/api/v1alpha1", true},
	} {
		if got := forbidden(tc.pkg, tc.imp) == ""; got != tc.ok {
			t.Errorf("%s importing %s allowed = %v, want %v (%s)", tc.pkg, tc.imp, got, tc.ok, forbidden(tc.pkg, tc.imp))
		}
	}
}

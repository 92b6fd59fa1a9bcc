package matrix

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// versions reads versions.env.
func versions(t *testing.T) map[string][]string {
	t.Helper()
	v, err := ReadVersions("versions.env")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Every kubelet of the matrix has the wrapper module build.sh builds it from, and build.sh
// builds the newest as the default.
func TestKubeletWrappers(t *testing.T) {
	list := versions(t)["KUBELET_VERSIONS"]
	for _, v := range list {
		b, err := os.ReadFile(filepath.Join("..", "cluster", "k8s", v, "go.mod"))
		if err != nil {
			t.Errorf("kubelet %s: %v (generate it: test/cluster/update.sh k8s %s)", v, err, v)
			continue
		}
		if !regexp.MustCompile(`(?m)^\s*(require )?k8s\.io/kubernetes ` + regexp.QuoteMeta(v) + `( // indirect)?$`).Match(b) {
			t.Errorf("test/cluster/k8s/%s/go.mod does not require k8s.io/kubernetes %s", v, v)
		}
	}
	build, err := os.ReadFile(filepath.Join("..", "cluster", "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if newest := list[len(list)-1]; !strings.Contains(string(build), "\nK8S_VERSION="+newest+"\n") {
		t.Errorf("build.sh's K8S_VERSION is not the matrix's newest kubelet %s", newest)
	}
}

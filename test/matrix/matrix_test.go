package matrix

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"

	"github.com/podgate/podgate/agent/compat"
)

// versions reads versions.env's KEY="v1 v2 …" lines.
func versions(t *testing.T) map[string][]string {
	t.Helper()
	f, err := os.Open("versions.env")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	line := regexp.MustCompile(`^([A-Z_]+)="([^"]*)"$`)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]] = strings.Fields(m[2])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The matrix's releases are the range podgate logs as tested, oldest first and newest last.
func TestVersionsMatchCompat(t *testing.T) {
	v := versions(t)
	for _, tc := range []struct {
		key string
		r   compat.Range
	}{{"KUBELET_VERSIONS", compat.Kubelet}, {"CONTAINERD_VERSIONS", compat.Containerd}} {
		list := v[tc.key]
		if len(list) < 2 {
			t.Fatalf("%s = %q: want the oldest and the newest release at least", tc.key, list)
		}
		for i, s := range list {
			if !tc.r.Check(s).Tested {
				t.Errorf("%s: %s is outside compat's %s", tc.key, s, tc.r)
			}
			if i > 0 && !version.MustParseSemantic(list[i-1]).LessThan(version.MustParseSemantic(s)) {
				t.Errorf("%s: %s after %s: want oldest first", tc.key, s, list[i-1])
			}
		}
		minor := func(s string) string {
			p := version.MustParseSemantic(s)
			return version.MajorMinor(p.Major(), p.Minor()).String()
		}
		if got := minor(list[0]); got != tc.r.Min {
			t.Errorf("%s starts at %s, compat's %s at %s", tc.key, got, tc.r, tc.r.Min)
		}
		if got := minor(list[len(list)-1]); got != tc.r.Max {
			t.Errorf("%s ends at %s, compat's %s at %s", tc.key, got, tc.r, tc.r.Max)
		}
	}
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

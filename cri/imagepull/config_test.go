package imagepull_test

import (
	"strings"
	"testing"

	"github.com/podgate/podgate/cri/imagepull"
)

// TestValidatePerRegistry: imagePulls.perRegistry takes registry hosts, Docker Hub's aliases
// and upper case included, each with a positive cap; every bad key is named, and two keys of one
// registry are refused.
func TestValidatePerRegistry(t *testing.T) {
	const field = "imagePulls.perRegistry"
	if err := imagepull.ValidatePerRegistry(field, map[string]int32{"index.docker.io": 2, "Quay.io": 1, "127.0.0.1:5000": 4}); err != nil {
		t.Errorf("valid caps: %v", err)
	}
	for _, tc := range []struct {
		caps map[string]int32
		want []string
	}{
		{map[string]int32{"docker.io": 0, "a/b": 1, "": 1}, []string{
			`imagePulls.perRegistry["docker.io"]: must be positive`, `imagePulls.perRegistry["a/b"]`, `imagePulls.perRegistry[""]: empty registry host`}},
		{map[string]int32{"docker.io": 1, "index.docker.io": 2}, []string{`imagePulls.perRegistry["index.docker.io"]: the same registry as "docker.io"`}},
	} {
		err := imagepull.ValidatePerRegistry(field, tc.caps)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want an error with %q", tc.caps, err, w)
			}
		}
	}
}

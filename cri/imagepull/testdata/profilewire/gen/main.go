// Command gen writes the golden messages of cri/imagepull's TestProfileWireGolden with the
// generated code of k8s.io/cri-api v0.38.0-beta.0, which podgate's own module cannot use yet
// (it needs Go 1.27, and podgate stays on cri-api v0.37 until v0.38.0 is served). Run it from
// this directory:
//
//	GOTOOLCHAIN=go1.27.3 go run . ..
//
// It writes request.bin (a PullSecurityProfileRequest with every field set) and response.bin
// (a PullSecurityProfileResponse with cached true) into the directory given.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gen DIR")
		os.Exit(2)
	}
	ref := "registry.example.com/profiles/strict@sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
	req := &runtimeapi.PullSecurityProfileRequest{
		Image: &runtimeapi.ImageSpec{Image: ref, UserSpecifiedImage: ref, RuntimeHandler: "kata",
			Annotations: map[string]string{"a": "b"}},
		Auth: &runtimeapi.AuthConfig{Username: "user", Password: "secret", ServerAddress: "registry.example.com"},
		SandboxConfig: &runtimeapi.PodSandboxConfig{
			Metadata:    &runtimeapi.PodSandboxMetadata{Name: "web", Namespace: "prod", Uid: "uid-web", Attempt: 2},
			Labels:      map[string]string{"app": "web"},
			Annotations: map[string]string{"note": "x"},
		},
		ProfileKind: runtimeapi.SecurityProfileKind_Seccomp,
	}
	resp := &runtimeapi.PullSecurityProfileResponse{Cached: true}
	for name, m := range map[string]proto.Message{"request.bin": req, "response.bin": resp} {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err == nil {
			err = os.WriteFile(filepath.Join(os.Args[1], name), b, 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

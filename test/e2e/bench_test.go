package e2e

import (
	"fmt"
	"path/filepath"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// BenchmarkRunPodSandbox measures what sysctl validation, defaults and verification add to
// RunPodSandbox on the real stack: the same pod (with net.ipv4.tcp_keepalive_time) started
// directly on containerd and through podgate, alternately, in one run. Only RunPodSandbox is
// timed; stopping and removing the sandbox is not.
//
//	go test -run '^$' -bench RunPodSandbox -benchtime 30x -count 5 ./test/e2e
func BenchmarkRunPodSandbox(b *testing.B) {
	if testing.Short() {
		b.Skip("real stack")
	}
	n := startNode(b, "--config", writeConfig(b, "sysctls: {podDefaults: {net.ipv4.tcp_fin_timeout: \"30\"}}\n"))
	for _, path := range []string{"direct", "podgate"} {
		client := n.direct
		if path == "podgate" {
			client = n.through
		}
		b.Run("path="+path, func(b *testing.B) {
			ctx := b.Context()
			i := 0
			for b.Loop() {
				i++
				name := fmt.Sprintf("bench-%s-%d", path, i)
				sb := &runtimeapi.PodSandboxConfig{
					Metadata:     &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "bench", Uid: name},
					LogDirectory: filepath.Join(n.rig.Dir, "pods", name),
					Linux:        &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}},
				}
				id, err := client.Runtime.RunPodSandbox(ctx, sb, "")
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if err := client.Runtime.StopPodSandbox(ctx, id); err != nil {
					b.Fatal(err)
				}
				if err := client.Runtime.RemovePodSandbox(ctx, id); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

package manager_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/dra/dratest/rig"
)

// BenchmarkDRAPrepareStage measures what the DRA stage adds to RunPodSandbox: the stage alone,
// on real gRPC (the fake driver on a unix socket) with a fake API server, for a pod without
// claims and for a pod with one claim whose driver answers at once. Each iteration is a new
// pod, so every claim is resolved and prepared anew; the node holds at most 110 pods (the
// kubelet's default maxPods), older ones leave the registry. It reports the API requests made
// per pod.
//
//	go test -run '^$' -bench DRAPrepareStage -benchtime 2000x ./dra/manager
func BenchmarkDRAPrepareStage(b *testing.B) {
	for _, claims := range []int{0, 1} {
		b.Run(fmt.Sprintf("claims=%d", claims), func(b *testing.B) {
			const pods, maxPods = 4000, 110
			objs := make([]runtime.Object, 0, 2*pods)
			podList := make([]*corev1.Pod, 0, pods)
			for i := range pods {
				var p *corev1.Pod
				if claims == 0 {
					p = rig.Pod(fmt.Sprint(i))
				} else {
					name := fmt.Sprintf("net-%d", i)
					p = rig.Pod(fmt.Sprint(i), name)
					objs = append(objs, rig.Claim(name, p))
				}
				objs = append(objs, p)
				podList = append(podList, p)
			}
			dr := newRig(b, 5*time.Second, objs...)
			stage := dr.Manager.PrepareStage()
			ctx := klog.NewContext(b.Context(), klog.Background().V(5))
			i := 0
			start := dr.Gets()
			for b.Loop() {
				p := podList[i%pods]
				i++
				sb := pipeline.NewSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
					Metadata: &runtimeapi.PodSandboxMetadata{Name: p.Name, Namespace: p.Namespace, Uid: string(p.UID)},
				}}, nil)
				if err := stage.Run(ctx, sb); err != nil {
					b.Fatal(err)
				}
				sb.End()
				if i > maxPods {
					rig.ForgetPodClaims(b, dr.ClaimStore, podList[(i-maxPods)%pods].UID)
				}
			}
			b.ReportMetric(float64(dr.Gets()-start)/float64(i), "api-gets/pod")
			b.ReportMetric(float64(len(dr.Driver.Calls()))/float64(i), "driver-calls/pod")
		})
	}
}

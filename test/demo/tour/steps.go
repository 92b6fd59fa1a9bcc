//go:build linux

package tour

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	prv1alpha1 "github.com/podgate/podgate/podresources/api/v1alpha1"
	"github.com/podgate/podgate/test/demo/timeline"
	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/dranode"
)

// The pod sysctl default of the demo's configuration, and the host's value it replaces.
const (
	keepalive      = "net.ipv4.tcp_keepalive_time"
	keepaliveValue = "600"
)

// PlainPod starts pod demo/hello, which asks for no sysctl and no device, as the kubelet starts
// a pod, and shows podgate's sysctl default and verification, and the pull queue.
func (e *Env) PlainPod(ctx context.Context) (*PodStart, error) {
	e.step("Pod %s/hello, started as the kubelet starts a pod: RunPodSandbox, PullImage, CreateContainer, StartContainer", Namespace)
	ref, err := e.busyboxImage(e.RegA, "pods/hello")
	if err != nil {
		return nil, err
	}
	pod, err := e.createPod(ctx, Namespace, "hello", ref, nil)
	if err != nil {
		return nil, err
	}
	ps, err := e.startPod(ctx, pod, ref)
	if err != nil {
		return nil, err
	}
	e.pods = append(e.pods, ps.Timeline, ps.Zoomed())
	if err := e.sayPodStart(ctx, ps); err != nil {
		return nil, err
	}
	return ps, nil
}

// sayPodStart prints what podgate did with a pod's sysctls and pull.
func (e *Env) sayPodStart(ctx context.Context, ps *PodStart) error {
	stdout, _, err := e.Direct.Runtime.ExecSync(ctx, ps.ContainerID, []string{"cat", "/proc/sys/net/ipv4/tcp_keepalive_time"}, 10*time.Second)
	if err != nil {
		return err
	}
	host, err := os.ReadFile("/proc/sys/net/ipv4/tcp_keepalive_time")
	if err != nil {
		return err
	}
	got, err := e.extensionPod(ctx, ps.Pod.Namespace, ps.Pod.Name)
	if err != nil {
		return err
	}
	sys := got.GetSandbox().GetSysctls()
	e.say("sysctl default: podgate added %s=%s to the pod, which asked for %s; inside the pod it reads %s (the host keeps %s): "+
		"every pod gets the node's keepalive without a change to its spec", keepalive, sys.GetApplied()[keepalive], asked(sys.GetAsked()),
		strings.TrimSpace(string(stdout)), strings.TrimSpace(string(host)))
	e.say("verification: podgate read the sysctls back inside the pod's network namespace before it answered RunPodSandbox "+
		"(%s, verify: fail): %s: a sysctl the runtime did not apply fails the pod instead of running it wrong", fmtDur(ps.Stage("sysctl-verify")), sys.GetVerification())
	e.say("pull queue: the pod's image waited %s in podgate's queue behind %d pulls of other pods from registry A (its cap), then took %s: "+
		"podgate's own timings, in the timeline", fmtDur(ps.PullWait), blockersPerPull, fmtDur(ps.Pull))
	return nil
}

// asked lists the sysctls a pod asked for.
func asked(m map[string]string) string {
	if len(m) == 0 {
		return "none"
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return strings.Join(out, ", ")
}

// DRAReport is what the DRA step printed, from podgate's side and the recording CNI plugin's.
type DRAReport struct {
	Start *PodStart
	// HostInterface is the device's interface on the host; InterfaceName, IPs and MTU what
	// podgate's PodResources extension says the pod got.
	HostInterface, InterfaceName string
	IPs                          []string
	MTU                          int32
	// AtCNIAdd says whether the recording CNI plugin found HostInterface on the host at the
	// pod's CNI ADD, and when that ADD ran.
	AtCNIAdd   bool
	CNIAddTime time.Time
	// OnHostAfter says whether HostInterface is still on the host once the pod runs.
	OnHostAfter bool
	// StatusInterface and StatusIPs are what the claim's status.devices shows.
	StatusInterface string
	StatusIPs       []string
}

// webOpaque is the claim's configuration for the driver: the device's name, MTU and address in
// the pod.
const webOpaque = `{"interface": {"name": "net1", "mtu": 1400, "addresses": ["192.0.2.10/24"]}}`

// DRAPod starts pod demo/web, whose DRA claim asks for device nic0 of the test driver as net1,
// and shows that podgate prepares the claim before CNI, moves the device into the pod and
// publishes its network data in the claim's status.
func (e *Env) DRAPod(ctx context.Context) (*DRAReport, error) {
	e.step("Pod %s/web with a DRA network claim (device nic0 of driver %s, asked as net1 in the pod), started the same way", Namespace, dranode.DriverName)
	ref, err := e.busyboxImage(e.RegA, "pods/web")
	if err != nil {
		return nil, err
	}
	pod, err := dranode.Pod{Namespace: Namespace, Name: "web", Node: e.Cluster.NodeName(), Device: 0, Opaque: webOpaque, PodLevel: true, Image: ref}.Create(ctx, e.Kube)
	if err != nil {
		return nil, err
	}
	e.apiPods = append(e.apiPods, pod)
	ps, err := e.startPod(ctx, pod, ref)
	if err != nil {
		return nil, err
	}
	rep := &DRAReport{Start: ps}
	add := ps.CNIAdd
	got, err := e.extensionPod(ctx, pod.Namespace, pod.Name)
	if err != nil {
		return nil, err
	}
	for _, c := range got.GetClaims() {
		for _, d := range c.GetDevices() {
			if n := d.GetNetwork(); n != nil {
				rep.HostInterface, rep.InterfaceName, rep.IPs, rep.MTU = n.GetHostInterface(), n.GetInterfaceName(), n.GetIps(), n.GetMtu()
			}
		}
	}
	rep.AtCNIAdd, rep.CNIAddTime = add.Interfaces[rep.HostInterface], add.Time
	rep.OnHostAfter = dranode.HostHasLink(rep.HostInterface)
	claim, err := e.Kube.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for _, d := range claim.Status.Devices {
		if d.NetworkData != nil {
			rep.StatusInterface, rep.StatusIPs = d.NetworkData.InterfaceName, d.NetworkData.IPs
		}
	}
	evs, err := dranode.Events(e.Events, pod.Name)
	if err != nil {
		return nil, err
	}
	for _, ev := range evs {
		if ev.Op == driver.OpPrepare {
			// Before the CNI ADD, as it happened.
			ps.Timeline.Marks = slices.Insert(ps.Timeline.Marks, 0, timeline.Mark{Name: "driver prepared", At: ev.Time,
				Detail: fmt.Sprintf("%s prepared %s for %s (created %s)", dranode.DriverName, strings.Join(ev.Devices, ","), ev.Caller.Comm, strings.Join(ev.Created, ","))})
		}
	}
	e.pods = append(e.pods, ps.Timeline, ps.Zoomed())

	e.say("prepare: podgate had the driver prepare claim %s/%s (%s) before it forwarded RunPodSandbox; at CNI ADD %s was on the host: %v "+
		"(recording CNI plugin): a CNI plugin finds the device it is to move, whichever CRI client started the pod",
		pod.Namespace, pod.Name, fmtDur(ps.Stage("dra-prepare")), rep.HostInterface, rep.AtCNIAdd)
	e.say("attach: once CNI had run, podgate moved %s into the pod as %s (%s, MTU %d); on the host now: %v: the pod has its device, and only the pod",
		rep.HostInterface, rep.InterfaceName, strings.Join(rep.IPs, ","), rep.MTU, rep.OnHostAfter)
	e.say("status: claim %s/%s's status.devices shows %s with %s: the cluster sees the pod's network through the API (KEP-4817)",
		pod.Namespace, pod.Name, rep.StatusInterface, strings.Join(rep.StatusIPs, ","))
	e.say("pull queue: the pod's image waited %s behind %d pulls from registry A, then took %s", fmtDur(ps.PullWait), blockersPerPull, fmtDur(ps.Pull))
	return rep, nil
}

// RefusedSysctl asks, as a CRI client other than the kubelet may, for a pod that sets a
// node-wide sysctl, and shows that podgate refuses it before anything exists.
func (e *Env) RefusedSysctl(ctx context.Context) error {
	e.step("A CRI client asks for a pod that sets kernel.core_pattern, a node-wide sysctl")
	before, err := e.Direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return err
	}
	// The refusal is the point: the client's own error log of it is dropped.
	_, refusal := e.Through.Runtime.RunPodSandbox(klog.NewContext(ctx, logr.Discard()), &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: "evil", Namespace: Namespace, Uid: "demo-evil"},
		Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"kernel.core_pattern": "|/tmp/x"}},
	}, "")
	if status.Code(refusal) != codes.InvalidArgument {
		return fmt.Errorf("RunPodSandbox with kernel.core_pattern: %w, want InvalidArgument", refusal)
	}
	after, err := e.Direct.Runtime.ListPodSandbox(ctx, nil)
	if err != nil {
		return err
	}
	e.say("refused: %v; containerd has %d sandboxes, as before (%d): nothing was created, no netns, no CNI, "+
		"where runc would fail the sandbox only after CNI", refusal, len(after), len(before))
	return nil
}

// PodResources shows what podgate's PodResources extension answers for pod web: what a meta-CNI
// plugin such as multus reads while CNI runs.
func (e *Env) PodResources(ctx context.Context) error {
	e.step("PodResources, as a meta-CNI plugin reads it: Get %s/web on %s", Namespace, e.Podgate.PodResourcesSocket)
	pod, err := e.extensionPod(ctx, Namespace, "web")
	if err != nil {
		return err
	}
	e.say("podgate answers with the sandbox, its sysctls and each DRA device with the claim it serves and its network data, " +
		"from the moment the claims are prepared: a meta-CNI plugin learns the pod's devices during CNI ADD from one local call, not from the API server")
	b, err := protojson.Marshal(pod)
	if err != nil {
		return err
	}
	// protojson varies its spacing on purpose; encoding/json lays it out the same every time.
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, b, "        ", "  "); err != nil {
		return err
	}
	fmt.Fprintf(e.Out, "        %s\n", pretty.String())
	return nil
}

// extensionPod asks podgate's PodResources extension for one pod.
func (e *Env) extensionPod(ctx context.Context, namespace, name string) (*prv1alpha1.Pod, error) {
	conn, err := grpc.NewClient("unix://"+e.Podgate.PodResourcesSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := prv1alpha1.NewPodResourcesClient(conn).Get(ctx, &prv1alpha1.GetRequest{PodName: name, PodNamespace: namespace})
	if err != nil {
		return nil, fmt.Errorf("PodResources Get %s/%s: %w", namespace, name, err)
	}
	return resp.GetPod(), nil
}

// Timeline draws the pods started so far into OutDir/timeline.svg and returns its path.
func (e *Env) Timeline() (string, error) {
	e.step("Timeline of each pod start, from podgate's own timings")
	path := filepath.Join(e.OutDir, "timeline.svg")
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := timeline.Write(f, "podgate: pod starts on a real containerd, as the kubelet makes them", e.pods); err != nil {
		return "", fmt.Errorf("%w (and %w)", err, f.Close())
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	e.say("%s: for each pod, the CRI calls and podgate's stages inside them on one time axis (open it in a browser)", path)
	for _, p := range e.pods {
		if strings.HasSuffix(p.Name, ": RunPodSandbox") {
			continue // the zoomed panel repeats its pod's stages
		}
		var parts []string
		for _, s := range p.Spans {
			if s.Lane == timeline.Podgate {
				parts = append(parts, s.Name+" "+fmtDur(s.End.Sub(s.Start)))
			}
		}
		e.say("%s: %s", p.Name, strings.Join(parts, ", "))
	}
	return path, nil
}

// Cleanup stops and removes the pods the steps started, through podgate as the kubelet does,
// deletes them in the API server, and shows podgate giving the device back and having the
// driver unprepare the claim.
func (e *Env) Cleanup(ctx context.Context) error {
	e.step("Stopping and deleting the pods, as the kubelet does")
	backOnHost := false
	for _, s := range slices.Backward(e.sandboxes) {
		if s.container != "" {
			if err := e.Through.Runtime.StopContainer(ctx, s.container, 0); err != nil {
				return err
			}
			if err := e.Through.Runtime.RemoveContainer(ctx, s.container); err != nil {
				return err
			}
		}
		if err := e.Through.Runtime.StopPodSandbox(ctx, s.sandbox); err != nil {
			return err
		}
		if s.pod.Name == "web" {
			backOnHost = dranode.HostHasLink(InterfacePrefix + "0")
		}
		if err := e.Through.Runtime.RemovePodSandbox(ctx, s.sandbox); err != nil {
			return err
		}
	}
	for _, p := range e.apiPods {
		if err := dranode.DeletePod(ctx, e.Kube, p); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if !slices.ContainsFunc(e.apiPods, func(p *corev1.Pod) bool { return p.Name == "web" }) {
		e.say("%d pods stopped and removed", len(e.sandboxes))
		return nil
	}
	var unprepared driver.Event
	if err := e.waitFor(ctx, "the driver unpreparing claim web", func(context.Context) (bool, error) {
		evs, err := dranode.Events(e.Events, "web")
		for _, ev := range evs {
			if ev.Op == driver.OpUnprepare && ev.Error == "" {
				unprepared = ev
				return true, nil
			}
		}
		return false, err
	}); err != nil {
		return err
	}
	e.say("give-back: on StopPodSandbox podgate moved the device back to the host (%s0 on the host: %v); with the pod gone from the API "+
		"and containerd, it had the driver unprepare claim %s/web (%s by %s): nothing left behind", InterfacePrefix, backOnHost, Namespace, unprepared.Op, unprepared.Caller.Comm)
	return nil
}

// fmtDur writes d with three significant digits at most, as the timeline does.
func fmtDur(d time.Duration) string { return timeline.FormatDuration(d) }

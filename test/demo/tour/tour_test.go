//go:build linux

package tour_test

import (
	"bytes"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/demo/timeline"
	"github.com/podgate/podgate/test/demo/tour"
	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/registry"
)

// TestPullsAndDRA runs the demo's pull and DRA steps on the real stack and checks what they
// print against what others recorded: the registries' request logs, containerd's images and the
// pod's own network (through containerd, past podgate), the DRA driver's call log, the recording
// CNI plugin's file and the API server. It also reads the timeline picture back.
func TestPullsAndDRA(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the demo runs containerd, runc and CNI, and its DRA driver creates host interfaces")
	}
	if err := tour.CheckInstalled(); err != nil {
		t.Skipf("%v: make rig-node rig-control-plane", err)
	}
	_, ctx := ktesting.NewTestContext(t)
	var out bytes.Buffer
	e, err := tour.Up(ctx, &out, t.TempDir())
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Cleanup(func() {
		if err := e.Down(ctx); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("the demo printed:\n%s", out.String())
		}
	})

	start := out.Len()
	if _, err := e.Pulls(ctx); err != nil {
		t.Fatal(err)
	}
	checkPulls(t, e, out.String()[start:])

	start = out.Len()
	dra, err := e.DRAPod(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkDRA(t, e, dra, out.String()[start:])

	path, err := e.Timeline()
	if err != nil {
		t.Fatal(err)
	}
	checkTimeline(t, path, dra.Start)

	if err := e.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := dranode.Events(e.Events, "web")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(ev driver.Event) bool {
		return ev.Op == driver.OpUnprepare && ev.Caller.Comm == "podgate" && ev.Error == ""
	}) {
		t.Errorf("driver call log %+v: no unprepare of claim web by podgate after the cleanup", evs)
	}
}

// find returns the submatches of re in printed, failing the test when it is not there.
func find(t *testing.T, printed string, re string) []string {
	t.Helper()
	m := regexp.MustCompile(re).FindStringSubmatch(printed)
	if m == nil {
		t.Fatalf("the step printed no line matching %q:\n%s", re, printed)
	}
	return m
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// repoOf is an image reference's repository at its registry (host/repo:tag).
func repoOf(ref string) string {
	_, rest, _ := strings.Cut(ref, "/")
	repo, _, _ := strings.Cut(rest, ":")
	return repo
}

func checkPulls(t *testing.T, e *tour.Env, printed string) {
	logA, logB := e.RegA.Requests(), e.RegB.Requests()
	all := append(slices.Clone(logA), logB...)

	// cap: what podgate ran and queued is what the registries served at once.
	m := find(t, printed, `cap: podgate ran (\d+) pulls at once \((\d+) from registry A, its own cap\) and held (\d+) in its queue`)
	running, runningA, queued := atoi(t, m[1]), atoi(t, m[2]), atoi(t, m[3])
	if running != 3 || runningA != 2 || queued == 0 {
		t.Errorf("printed %d running (%d from A), %d queued; want the node's cap 3, A's cap 2, and a queue", running, runningA, queued)
	}
	if got := registry.MaxAtOnce(all, registry.ByRepo); got != running {
		t.Errorf("the registries served %d images at once; the demo printed %d", got, running)
	}
	if got := registry.MaxAtOnce(logA, registry.ByRepo); got != runningA {
		t.Errorf("registry A served %d images at once; the demo printed %d", got, runningA)
	}

	// priority: the critical pod's image is among the first the registries saw once the
	// running pulls were done.
	m = find(t, printed, `priority: pod kube-system/critical asked last \((\d+) of \d+\), and its pull started (\d+)(st|nd|rd|th)`)
	if pos := atoi(t, m[2]); pos != running+1 {
		t.Errorf("printed: the critical pull started %s; want right after the %d running", m[2]+m[3], running)
	}
	order := registry.FirstRequests(all)
	critical := slices.Index(order, "pulls/b4")
	if critical < running || critical >= 2*running {
		t.Errorf("the registries first saw images in the order %v: pulls/b4, the critical pod's, should start with the next free slots", order)
	}

	// de-duplication: one download of the image two pods asked for, and containerd has it.
	m = find(t, printed, `de-duplication: pods \S+ and \S+ both asked for (\S+); podgate started (\d+) pull for both \((\d+) call joined another's\)`)
	twin, pulls, joined := m[1], atoi(t, m[2]), atoi(t, m[3])
	if pulls != 1 || joined != 1 {
		t.Errorf("printed %d pulls and %d joined for %s; want 1 and 1", pulls, joined, twin)
	}
	gets := map[string]int{}
	for _, q := range logA {
		if q.Repo == repoOf(twin) && q.Kind == "blobs" && q.Method == http.MethodGet {
			gets[q.Ref]++
		}
	}
	if len(gets) != 2 {
		t.Errorf("registry A served blobs %v of %s; want its config and layer", gets, twin)
	}
	for blob, n := range gets {
		if n != 1 {
			t.Errorf("registry A served blob %s of %s %d times; the demo printed one pull", blob, twin, n)
		}
	}

	// cancellation: never asked of the registry, never in containerd.
	m = find(t, printed, `cancellation: pod \S+/gone was deleted in the API server while its pull of (\S+) waited; podgate answered (\w+) \((\d+) cancelled`)
	gone, code := m[1], m[2]
	if code != codes.Aborted.String() || atoi(t, m[3]) != 1 {
		t.Errorf("printed: the deleted pod's pull answered %s, %s cancelled; want Aborted, 1", code, m[3])
	}
	if slices.ContainsFunc(logB, func(q registry.Request) bool { return q.Repo == repoOf(gone) }) {
		t.Errorf("registry B served %s, the deleted pod's image", gone)
	}
	ctx := t.Context()
	for _, ref := range []string{twin, gone} {
		img, err := e.Direct.Images.ImageStatus(ctx, &runtimeapi.ImageSpec{Image: ref}, false)
		if err != nil {
			t.Fatal(err)
		}
		if have := img.GetImage() != nil; have != (ref == twin) {
			t.Errorf("containerd has image %s: %v; want it only for the pulled one", ref, have)
		}
	}
}

func checkDRA(t *testing.T, e *tour.Env, dra *tour.DRAReport, printed string) {
	ctx := t.Context()
	// prepare: the driver's call log has podgate's prepare, which created the interface, before
	// the CNI ADD the recording plugin logged.
	m := find(t, printed, `prepare: podgate had the driver prepare claim demo/web \(\S+\) before it forwarded RunPodSandbox; at CNI ADD (\S+) was on the host: (\w+)`)
	iface, atAdd := m[1], m[2]
	if iface != tour.InterfacePrefix+"0" || atAdd != "true" {
		t.Errorf("printed: at CNI ADD %s on the host: %s; want %s0, true", iface, atAdd, tour.InterfacePrefix)
	}
	evs, err := dranode.Events(e.Events, "web")
	if err != nil {
		t.Fatal(err)
	}
	add, ok, err := dranode.CNIAdd(e.Records, tour.Namespace, "web")
	if err != nil || !ok {
		t.Fatalf("the recording CNI plugin's ADD of web: found %v, %v", ok, err)
	}
	if len(evs) != 1 || evs[0].Op != driver.OpPrepare || evs[0].Caller.Comm != "podgate" || !slices.Contains(evs[0].Created, iface) || !evs[0].Time.Before(add.Time) {
		t.Errorf("driver call log %+v, CNI ADD at %s: want one prepare by podgate that created %s before the ADD", evs, add.Time.Format(time.StampMicro), iface)
	}

	// attach: inside the pod, as containerd (not podgate) shows it.
	m = find(t, printed, `attach: once CNI had run, podgate moved (\S+) into the pod as (\S+) \((\S+), MTU (\d+)\); on the host now: (\w+)`)
	name, addr, mtu, onHost := m[2], m[3], m[4], m[5]
	inPod := func(cmd ...string) string {
		stdout, stderr, err := e.Direct.Runtime.ExecSync(ctx, dra.Start.ContainerID, cmd, 10*time.Second)
		if err != nil {
			t.Fatalf("exec %v in web: %v %s", cmd, err, stderr)
		}
		return strings.TrimSpace(string(stdout))
	}
	if got := inPod("ip", "-o", "addr", "show", "dev", name); !strings.Contains(got, addr) {
		t.Errorf("in the pod, ip addr show %s: %q; the demo printed %s", name, got, addr)
	}
	if got := inPod("cat", "/sys/class/net/"+name+"/mtu"); got != mtu {
		t.Errorf("in the pod, %s's MTU is %s; the demo printed %s", name, got, mtu)
	}
	if onHost != "false" || dranode.HostHasLink(iface) {
		t.Errorf("printed %s on the host: %s; on the host now: %v; want neither", iface, onHost, dranode.HostHasLink(iface))
	}

	// status: what the API server holds.
	m = find(t, printed, `status: claim demo/web's status.devices shows (\S+) with (\S+):`)
	claim, err := e.Kube.ResourceV1().ResourceClaims(tour.Namespace).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(claim.Status.Devices) != 1 || claim.Status.Devices[0].NetworkData == nil ||
		claim.Status.Devices[0].NetworkData.InterfaceName != m[1] || strings.Join(claim.Status.Devices[0].NetworkData.IPs, ",") != m[2] {
		t.Errorf("claim status devices %+v; the demo printed %s with %s", claim.Status.Devices, m[1], m[2])
	}
}

// checkTimeline reads the picture back: the DRA pod's start is drawn with podgate's stages in
// the pipeline's order inside RunPodSandbox, the pull's wait then the pull inside PullImage, the
// driver's prepare and the CNI ADD inside; and the times drawn (podgate's spans) agree with what
// podgate's histograms say of the same start.
func checkTimeline(t *testing.T, path string, start *tour.PodStart) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pods, err := timeline.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(pods, func(p timeline.DrawnPod) bool { return p.Name == tour.Namespace+"/web" })
	if i < 0 {
		t.Fatalf("timeline %s has no pod %s/web: %+v", path, tour.Namespace, pods)
	}
	web := pods[i]
	if err := timeline.CheckPodStart(web, tour.SandboxStages); err != nil {
		t.Error(err)
	}
	for _, mark := range []string{"driver prepared", "CNI ADD"} {
		if _, ok := web.Mark(mark); !ok {
			t.Errorf("timeline: pod web has no mark %q: %+v", mark, web.Marks)
		}
	}
	for _, call := range []string{"CreateContainer", "StartContainer"} {
		if _, ok := web.Span(timeline.Kubelet, call); !ok {
			t.Errorf("timeline: pod web has no %s", call)
		}
	}
	drawn := func(name string) time.Duration {
		s, _ := web.Span(timeline.Podgate, name)
		return time.Duration((s.EndMS - s.StartMS) * float64(time.Millisecond))
	}
	// A stage's histogram observation wraps its span: never shorter, and longer only by what
	// a loaded machine delays a goroutine between the two.
	for _, st := range start.Stages {
		if d := st.Duration - drawn(st.Name); d < -time.Microsecond || d > max(10*time.Millisecond, st.Duration/4) {
			t.Errorf("stage %s: drawn %s (span), %s by podgate's histogram", st.Name, drawn(st.Name), st.Duration)
		}
	}
	// The pull's wait and time are measured by the governor's clock and by its spans a few
	// steps apart.
	for name, metric := range map[string]time.Duration{"pull-wait": start.PullWait, "pull": start.Pull} {
		if d := (metric - drawn(name)).Abs(); d > max(20*time.Millisecond, metric/20) {
			t.Errorf("%s: drawn %s (span), %s by podgate's histogram", name, drawn(name), metric)
		}
	}
}

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/registry"
	"github.com/podgate/podgate/test/rig"
)

// The throttled-registry scenario of issue 48: throttledImages images of one registry that
// answers 429 for throttleFor, and as many of another registry, pulled at once through podgate
// without caps. containerd's resolver asks up to resolverTries times within one pull attempt.
const (
	throttledImages = 4
	throttleFor     = 5 * time.Second
	resolverTries   = 5
	throttleTimeout = 3 * time.Minute
	// throttledCoolDown: the first cool-down 1 s, then 2 s, then 4 s; in a 5-second limit the
	// registry is tried twice after the first refusals, each time by another pull.
	throttledCoolDown = "imagePulls:\n  coolDown:\n    initialDelay: 1s\n    maxDelay: 4s\n    retryFor: 2m\n"
)

// pullOutcome is one pull's end.
type pullOutcome struct {
	pod, image string
	err        error
	at         time.Time
}

// pullAll pulls each image through client at once, each for a pod (namespace e2e, name from
// pods, UID "uid-"+name), and returns every outcome once all are done.
func pullAll(ctx context.Context, client *rig.Client, images, pods []string) []pullOutcome {
	var wg sync.WaitGroup
	out := make([]pullOutcome, len(images))
	for i, image := range images {
		wg.Go(func() {
			sb := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "e2e", Name: pods[i], Uid: "uid-" + pods[i]}}
			_, err := client.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: image}, nil, sb)
			out[i] = pullOutcome{pod: pods[i], image: image, err: err, at: time.Now()}
		})
	}
	wg.Wait()
	return out
}

// repoOf is the repository of a reference the test registry pushed.
func repoOf(reg *registry.Registry, ref string) string {
	repo, _ := strings.CutSuffix(strings.TrimPrefix(ref, reg.Host+"/"), ":v1")
	return repo
}

// TestImagePullThrottled: containerd pulls through podgate from a registry that answers 429
// for a few seconds and from a second registry at once. Every pull of the throttled registry
// succeeds within its first PullImage call once the registry lets it, each tried at most twice
// while the limit lasted (counted at the registry: at most twice containerd's five requests);
// the other registry's pulls are never held; the pods of the throttled pulls are told why they
// wait (PullThrottled Events in the API server: the registry, the refusal, the next try), the
// others are told nothing; the metrics count the refusals and the retries.
func TestImagePullThrottled(t *testing.T) {
	r := rig.Start(t)
	// The API server for podgate's Events; no kubelet: the test plays it with a CRI client.
	c := cluster.Start(t, cluster.Options{CRIEndpoint: r.Endpoint, DeferKubelet: true})
	if _, err := c.CreateNamespace(t.Context(), "e2e"); err != nil {
		t.Fatal(err)
	}
	config := throttledCoolDown + fmt.Sprintf("dra:\n  pluginRegistryDir: %s\n", c.PluginRegistryDir())
	p := startPodgate(t, r.Endpoint, "--config", writeConfig(t, config), "--kubeconfig", c.Kubeconfig(), "--node-name", c.NodeName())
	through := rig.Connect(t, p.Endpoint)

	throttled, other := registry.New(64<<20), registry.New(64<<20)
	throttled.Serve(t)
	otherHost := other.Serve(t)
	throttledRefs := throttled.Push(t, "throttled", throttledImages, 64<<10)
	otherRefs := other.Push(t, "free", throttledImages, 64<<10)
	var images, pods []string
	for i, ref := range throttledRefs {
		images, pods = append(images, ref), append(pods, fmt.Sprintf("throttled-%d", i))
	}
	for i, ref := range otherRefs {
		images, pods = append(images, ref), append(pods, fmt.Sprintf("free-%d", i))
	}
	for _, reg := range []*registry.Registry{throttled, other} {
		reg.Count(true)
	}
	ctx, cancel := context.WithTimeout(t.Context(), throttleTimeout)
	defer cancel()

	throttled.Refuse(http.StatusTooManyRequests, "")
	var allowedAt time.Time
	var allowMu sync.Mutex
	limit := time.AfterFunc(throttleFor, func() { // the registry's limit: a few seconds
		throttled.Allow()
		allowMu.Lock()
		allowedAt = time.Now()
		allowMu.Unlock()
	})
	defer limit.Stop()
	outcomes := pullAll(ctx, through, images, pods)
	allowMu.Lock()
	allowed := allowedAt
	allowMu.Unlock()

	for _, o := range outcomes {
		if o.err != nil {
			t.Errorf("pod %s: pull of %s: %v", o.pod, o.image, o.err)
		}
	}
	refused := registry.RefusedByRepo(throttled.Requests())
	for _, ref := range throttledRefs {
		repo := repoOf(throttled, ref)
		if n := refused[repo]; n > 2*resolverTries {
			t.Errorf("%s: %d requests refused while the limit lasted, want at most %d (two pull attempts)", repo, n, 2*resolverTries)
		}
	}
	if len(refused) == 0 {
		t.Error("the registry refused no request: the limit was not met")
	}
	for _, q := range throttled.Requests() {
		if q.Refused != 0 && !allowed.IsZero() && q.Start.After(allowed) {
			t.Errorf("a request refused after the limit ended: %+v", q)
		}
	}
	if got := registry.RefusedByRepo(other.Requests()); len(got) != 0 {
		t.Errorf("the other registry refused %v", got)
	}
	log := p.Log.String()
	for line := range strings.Lines(log) {
		if strings.Contains(line, `registry="`+otherHost+`"`) && (strings.Contains(line, "Image pull waits") || strings.Contains(line, "pushed back")) {
			t.Errorf("podgate held a pull of the other registry: %s", line)
		}
	}
	m, err := p.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	pushBacks, _ := m.Value("podgate_image_pull_push_backs_total", "registry", "other", "code", "429")
	retries, _ := m.Value("podgate_image_pull_retries_total", "registry", "other")
	failures, _ := m.Value("podgate_image_pull_push_back_failures_total", "registry", "other")
	if pushBacks < 1 || retries < 1 || failures != 0 {
		t.Errorf("push-backs %v, retries %v, failures %v; want some, some, none", pushBacks, retries, failures)
	}
	t.Logf("limit %s; requests refused by repository %v; podgate: %v push-backs, %v retries", throttleFor, refused, pushBacks, retries)

	checkThrottledEvents(t, c, throttled.Host, pods)
}

// checkThrottledEvents: each pod of the throttled registry got a PullThrottled Event naming the
// registry, its 429, the cool-down and until when podgate holds the pull; the other registry's
// pods got no Event of podgate's.
func checkThrottledEvents(t *testing.T, c *cluster.Cluster, host string, pods []string) {
	t.Helper()
	want := map[types.UID]string{}
	for _, pod := range pods {
		want[types.UID("uid-"+pod)] = pod
	}
	told := map[string][]string{}
	waitWithin(t, time.Minute, "podgate's Events written", func() bool {
		list, err := c.Client().EventsV1().Events("e2e").List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		told = map[string][]string{}
		for _, e := range list.Items {
			if pod, ok := want[e.Regarding.UID]; ok && e.ReportingController == "podgate.dev/podgate" {
				told[pod] = append(told[pod], e.Reason+": "+e.Note)
			}
		}
		for _, pod := range pods {
			if strings.HasPrefix(pod, "throttled-") && !throttledNote(told[pod], host) {
				return false
			}
		}
		return true
	})
	for _, pod := range pods {
		switch {
		case strings.HasPrefix(pod, "throttled-") && !throttledNote(told[pod], host):
			t.Errorf("pod %s: Events %q, want a PullThrottled naming %s, 429, the cool-down and the hold", pod, told[pod], host)
		case strings.HasPrefix(pod, "free-") && len(told[pod]) > 0:
			t.Errorf("pod %s of the other registry: Events %q, want none", pod, told[pod])
		}
	}
	t.Logf("the first pod's Events: %q", told[pods[0]])
}

// throttledNote reports whether notes hold a PullThrottled Event of the registry host.
func throttledNote(notes []string, host string) bool {
	for _, n := range notes {
		if strings.HasPrefix(n, "PullThrottled: ") && strings.Contains(n, "registry "+host+" pushed back (429 Too Many Requests), cooling down since") &&
			strings.Contains(n, "podgate holds the pull until") {
			return true
		}
	}
	return false
}

// TestImagePullThrottledGivesUp: a registry that goes on refusing for longer than podgate holds
// a pull: the pull that met the 429 is tried again at the end of each cool-down, within its
// PullImage call, then its caller gets the registry's error as containerd gives it, word for
// word.
func TestImagePullThrottledGivesUp(t *testing.T) {
	const retryFor = 4 * time.Second
	n := startNode(t, "--config", writeConfig(t, fmt.Sprintf("imagePulls:\n  coolDown:\n    initialDelay: 1s\n    maxDelay: 1s\n    retryFor: %s\n", retryFor)))
	reg := registry.New(64 << 20)
	reg.Serve(t)
	ref := reg.Push(t, "refused", 1, 1024)[0]
	reg.Count(true)
	reg.Refuse(http.StatusTooManyRequests, "")
	ctx, cancel := context.WithTimeout(t.Context(), throttleTimeout)
	defer cancel()

	direct := directRefusal(ctx, t, n, reg, ref)
	start := time.Now()
	got := pullAll(ctx, n.through, []string{ref}, []string{"gives-up"})[0]
	if got.err == nil || got.err.Error() != direct.Error() {
		t.Errorf("the refused pull: %v; want containerd's own error unchanged: %v", got.err, direct)
	}
	m, err := n.podgate.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tries, _ := m.Value("podgate_image_pull_push_backs_total", "registry", "other", "code", "429")
	retries, _ := m.Value("podgate_image_pull_retries_total", "registry", "other")
	failures, _ := m.Value("podgate_image_pull_push_back_failures_total", "registry", "other")
	refused := registry.RefusedByRepo(reg.Requests())[repoOf(reg, ref)]
	t.Logf("the pull ended after %s: %v tries, %d requests refused", got.at.Sub(start).Round(time.Millisecond), tries, refused)
	// Cool-downs of 0.8-1 s within 4 s: 3 to 5 tries, each one of containerd's.
	if tries < 3 || tries > 5 || retries != tries-1 || failures != 1 {
		t.Errorf("%v tries, %v retries, %v pulls given the error; want 3 to 5 tries, one fewer retries, 1", tries, retries, failures)
	}
	if refused > int(tries)*resolverTries {
		t.Errorf("%d requests refused, want at most %d for %v tries", refused, int(tries)*resolverTries, tries)
	}
}

// TestImagePullHeldOver: a registry whose cool-down (20 s) outlasts podgate's hold (3 s): the
// pull that met the 429 gets the registry's error at once, without a retry that would come too
// late; a pull that arrives meanwhile waits in podgate's queue, tries the registry once when its
// own hold runs out (one pull at a time), and gets the registry's answer, its own 429.
func TestImagePullHeldOver(t *testing.T) {
	const retryFor = 3 * time.Second
	n := startNode(t, "--config", writeConfig(t, fmt.Sprintf("imagePulls:\n  coolDown:\n    initialDelay: 20s\n    maxDelay: 20s\n    retryFor: %s\n", retryFor)))
	reg := registry.New(64 << 20)
	reg.Serve(t)
	refs := reg.Push(t, "held", 2, 1024)
	reg.Count(true)
	reg.Refuse(http.StatusTooManyRequests, "")
	ctx, cancel := context.WithTimeout(t.Context(), throttleTimeout)
	defer cancel()

	direct := directRefusal(ctx, t, n, reg, refs[0])
	first := pullAll(ctx, n.through, refs[:1], []string{"held-0"})[0]
	if first.err == nil || first.err.Error() != direct.Error() {
		t.Errorf("the refused pull: %v; want containerd's own error unchanged: %v", first.err, direct)
	}
	arrived := time.Now()
	second := pullAll(ctx, n.through, refs[1:], []string{"held-1"})[0]
	if second.err == nil || !strings.Contains(second.err.Error(), "429 Too Many Requests") || !strings.Contains(second.err.Error(), repoOf(reg, refs[1])) {
		t.Errorf("the pull that waited: %v, want the registry's 429 for its own image", second.err)
	}
	refused := registry.RefusedByRepo(reg.Requests())
	var firstTry time.Time
	for _, q := range reg.Requests() {
		if q.Repo == repoOf(reg, refs[1]) && (firstTry.IsZero() || q.Start.Before(firstTry)) {
			firstTry = q.Start
		}
	}
	t.Logf("the second pull tried the registry %s after it arrived; requests refused by repository %v", firstTry.Sub(arrived).Round(time.Millisecond), refused)
	if firstTry.Sub(arrived) < retryFor {
		t.Errorf("the second pull reached the registry %s after it arrived, before its hold of %s ran out", firstTry.Sub(arrived), retryFor)
	}
	for i, ref := range refs {
		if got := refused[repoOf(reg, ref)]; got < 1 || got > resolverTries {
			t.Errorf("image %d: %d requests refused, want one try's (1 to %d)", i, got, resolverTries)
		}
	}
	m, err := n.podgate.Scrape(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("podgate_image_pull_retries_total", "registry", "other"); v != 0 {
		t.Errorf("podgate_image_pull_retries_total = %v, want 0", v)
	}
}

// directRefusal is containerd's own error for a pull of ref, past podgate, from the refusing
// registry reg, whose log it then clears.
func directRefusal(ctx context.Context, t *testing.T, n *node, reg *registry.Registry, ref string) error {
	t.Helper()
	_, err := n.direct.Images.PullImage(ctx, &runtimeapi.ImageSpec{Image: ref}, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "429 Too Many Requests") {
		t.Fatalf("containerd's own pull from the refusing registry: %v, want its 429", err)
	}
	reg.Reset()
	return err
}

package kube

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
)

// API is all podgate asks of the Kubernetes API: the node's pods (listed and watched by the
// informer, fetched one by one when the informer has not seen a pod yet), its Node (once, for
// memory QoS and the kubelet's version), ResourceClaims read and their status written, the
// node's ResourceSlices listed and watched. Client implements it; tests use test/kubefake over
// client-go's fake clientset. The features declare, each, the part they use (dra's
// ResourceClaimGetter and the like); agent checks that the adapter has it.
type API interface {
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error)
	WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error)
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	GetResourceClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error)
	UpdateResourceClaimStatus(ctx context.Context, claim *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error)
	ListResourceSlices(ctx context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error)
	WatchResourceSlices(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// EventWriter writes events.k8s.io/v1 Events: new ones, and the series of a repeated one.
type EventWriter interface {
	CreateEvent(ctx context.Context, event *eventsv1.Event) (*eventsv1.Event, error)
	// PatchEvent applies a JSON merge patch to an Event.
	PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*eventsv1.Event, error)
}

// Client is a Kubernetes client that knows only the types podgate uses (core/v1,
// resource.k8s.io/v1, and events.k8s.io/v1 to write Events). Like client-go's generated clients it speaks protobuf: JSON would
// re-encode what it does not own, e.g. a claim's opaque parameters on a status update, which
// the API server then refuses as a change of the immutable allocation. client-go's clientset would do the same requests, but it registers every
// built-in API group at start, and those types' code and tables cost ≈ 10 MiB of resident
// memory on every node (BENCHMARKS.md, "podgate's memory with 110 running pods").
type Client struct {
	core, resource, events rest.Interface
}

var (
	_ API         = (*Client)(nil)
	_ EventWriter = (*Client)(nil)
)

// kubeScheme holds core/v1, resource.k8s.io/v1 and events.k8s.io/v1 (each with the meta/v1
// options types).
var kubeScheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(corev1.AddToScheme(s))
	utilruntime.Must(resourceapi.AddToScheme(s))
	utilruntime.Must(eventsv1.AddToScheme(s))
	return s
}()

var (
	kubeCodecs = serializer.NewCodecFactory(kubeScheme)
	kubeParams = runtime.NewParameterCodec(kubeScheme)
)

// ClientOption configures a Client.
type ClientOption func(*rest.Config)

// WithRateLimit limits the client's requests to qps per second with bursts of burst (one token
// bucket shared by every request of the client, whatever its API group), as the kubelet's
// kubeAPIQPS and kubeAPIBurst.
func WithRateLimit(qps float32, burst int) ClientOption {
	return func(c *rest.Config) { c.QPS, c.Burst = qps, burst }
}

// NewClient builds a Kubernetes client from a kubeconfig file. Its user agent is "podgate", so
// that the API server's audit log and metrics tell its requests from the kubelet's.
func NewClient(kubeconfig string, opts ...ClientOption) (*Client, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	cfg.UserAgent = "podgate"
	for _, o := range opts {
		o(cfg)
	}
	return newClientForConfig(cfg)
}

// newClientForConfig builds the client for cfg: one HTTP client (connections, TLS) and one rate
// limiter shared by a REST client per API group.
func newClientForConfig(cfg *rest.Config) (*Client, error) {
	cfg = rest.CopyConfig(cfg)
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	if cfg.RateLimiter == nil && cfg.QPS >= 0 {
		// client-go gives each REST client a token bucket of its own when the config has
		// none: QPS and Burst would bound each API group, not podgate. One bucket for all, as
		// client-go's clientset (the kubelet's) makes; a negative QPS is no limit, as there.
		qps, burst := cfg.QPS, cfg.Burst
		if qps == 0 {
			qps = rest.DefaultQPS
		}
		if burst == 0 {
			burst = rest.DefaultBurst
		}
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
	}
	cfg.NegotiatedSerializer = kubeCodecs.WithoutConversion()
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	group := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.APIPath, c.GroupVersion = apiPath, &gv
		return rest.RESTClientForConfigAndClient(c, hc)
	}
	core, err := group("/api", corev1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	res, err := group("/apis", resourceapi.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	events, err := group("/apis", eventsv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &Client{core: core, resource: res, events: events}, nil
}

// CreateEvent implements EventWriter.
func (c *Client) CreateEvent(ctx context.Context, event *eventsv1.Event) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	if err := c.events.Post().UseProtobufAsDefault().Namespace(event.Namespace).Resource("events").Body(event).Do(ctx).Into(out); err != nil {
		return nil, fmt.Errorf("create Event %s/%s: %w", event.Namespace, event.Name, err)
	}
	return out, nil
}

// PatchEvent implements EventWriter.
func (c *Client) PatchEvent(ctx context.Context, namespace, name string, patch []byte) (*eventsv1.Event, error) {
	out := &eventsv1.Event{}
	if err := c.events.Patch(types.MergePatchType).UseProtobufAsDefault().Namespace(namespace).Resource("events").Name(name).
		Body(patch).Do(ctx).Into(out); err != nil {
		return nil, fmt.Errorf("patch Event %s/%s: %w", namespace, name, err)
	}
	return out, nil
}

// GetPod reads a pod.
func (c *Client) GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	pod := &corev1.Pod{}
	if err := c.core.Get().UseProtobufAsDefault().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(pod); err != nil {
		return nil, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	return pod, nil
}

// ListPods lists pods; namespace "" is every namespace.
func (c *Client) ListPods(ctx context.Context, namespace string, opts metav1.ListOptions) (*corev1.PodList, error) {
	list := &corev1.PodList{}
	if err := c.core.Get().UseProtobufAsDefault().Namespace(namespace).Resource("pods").VersionedParams(&opts, kubeParams).
		Timeout(timeoutOf(opts)).Do(ctx).Into(list); err != nil {
		return nil, fmt.Errorf("list pods (%s): %w", describeList(namespace, opts), err)
	}
	return list, nil
}

// WatchPods watches pods; namespace "" is every namespace.
func (c *Client) WatchPods(ctx context.Context, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	w, err := c.core.Get().UseProtobufAsDefault().Namespace(namespace).Resource("pods").VersionedParams(&opts, kubeParams).
		Timeout(timeoutOf(opts)).Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch pods (%s): %w", describeList(namespace, opts), err)
	}
	return w, nil
}

// GetNode reads a Node.
func (c *Client) GetNode(ctx context.Context, name string) (*corev1.Node, error) {
	node := &corev1.Node{}
	if err := c.core.Get().UseProtobufAsDefault().Resource("nodes").Name(name).Do(ctx).Into(node); err != nil {
		return nil, fmt.Errorf("get node %s: %w", name, err)
	}
	return node, nil
}

// GetResourceClaim reads a ResourceClaim.
func (c *Client) GetResourceClaim(ctx context.Context, namespace, name string) (*resourceapi.ResourceClaim, error) {
	claim := &resourceapi.ResourceClaim{}
	if err := c.resource.Get().UseProtobufAsDefault().Namespace(namespace).Resource("resourceclaims").Name(name).Do(ctx).Into(claim); err != nil {
		return nil, fmt.Errorf("get ResourceClaim %s/%s: %w", namespace, name, err)
	}
	return claim, nil
}

// UpdateResourceClaimStatus writes a ResourceClaim's status (the status subresource).
func (c *Client) UpdateResourceClaimStatus(ctx context.Context, claim *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error) {
	out := &resourceapi.ResourceClaim{}
	if err := c.resource.Put().UseProtobufAsDefault().Namespace(claim.Namespace).Resource("resourceclaims").Name(claim.Name).
		SubResource("status").Body(claim).Do(ctx).Into(out); err != nil {
		return nil, fmt.Errorf("update status of ResourceClaim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return out, nil
}

// ListResourceSlices lists ResourceSlices (cluster-scoped).
func (c *Client) ListResourceSlices(ctx context.Context, opts metav1.ListOptions) (*resourceapi.ResourceSliceList, error) {
	list := &resourceapi.ResourceSliceList{}
	if err := c.resource.Get().UseProtobufAsDefault().Resource("resourceslices").VersionedParams(&opts, kubeParams).
		Timeout(timeoutOf(opts)).Do(ctx).Into(list); err != nil {
		return nil, fmt.Errorf("list ResourceSlices (%s): %w", describeList("", opts), err)
	}
	return list, nil
}

// WatchResourceSlices watches ResourceSlices (cluster-scoped).
func (c *Client) WatchResourceSlices(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	w, err := c.resource.Get().UseProtobufAsDefault().Resource("resourceslices").VersionedParams(&opts, kubeParams).
		Timeout(timeoutOf(opts)).Watch(ctx)
	if err != nil {
		return nil, fmt.Errorf("watch ResourceSlices (%s): %w", describeList("", opts), err)
	}
	return w, nil
}

// describeList says what a list or watch asked for: the namespace and selectors, for errors.
func describeList(namespace string, opts metav1.ListOptions) string {
	parts := []string{"namespace " + cmp.Or(namespace, "*")}
	if opts.FieldSelector != "" {
		parts = append(parts, "fields "+opts.FieldSelector)
	}
	if opts.LabelSelector != "" {
		parts = append(parts, "labels "+opts.LabelSelector)
	}
	return strings.Join(parts, ", ")
}

// timeoutOf is the request timeout a list or watch asks for, as the generated clients set it.
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

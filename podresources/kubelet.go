package podresources

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// Limits of a call to the kubelet's PodResources socket.
const (
	// kubeletCallTimeout bounds one call: the kubelet answers from memory in milliseconds, and
	// a hung kubelet must leave time for another try within multus's 10 s.
	kubeletCallTimeout = 2 * time.Second
	// MaxMessageSize is the largest answer podgate sends or takes from the kubelet: multus's
	// client accepts 16 MiB.
	MaxMessageSize = 16 << 20
)

// Defaults of podgate's own token bucket for its calls to the kubelet's socket: half the
// kubelet's (a token bucket of 100 QPS, burst 10, fixed in the kubelet 1.36:
// pkg/kubelet/apis/podresources/constants.go). Half, because podgate's calls may reach the
// kubelet up to twice its burst at once (throttle), and because every client of the kubelet's
// socket shares its bucket: multus, device-plugin monitors and topology exporters keep the
// other half.
const (
	DefaultKubeletQPS   = 50
	DefaultKubeletBurst = 5
)

// Results of a call to the kubelet, the result label of
// podgate_podresources_kubelet_requests_total.
const (
	kubeletOK          = "ok"
	kubeletNotFound    = "not_found"   // Get: the kubelet does not know the pod
	kubeletRefused     = "refused"     // ResourceExhausted: over the kubelet's rate limit
	kubeletUnavailable = "unavailable" // not answering: restarting, hung
	kubeletAbsent      = "absent"      // no socket: no kubelet on this node
	// kubeletNotListening: a socket nobody listens on (connection refused), as a kubelet
	// that stopped or died leaves it behind.
	kubeletNotListening = "not_listening"
	kubeletError        = "error" // any other error
)

// listenProbeTimeout bounds the connect that tells a socket nobody listens on from a kubelet
// that does not answer: a refused connect on a unix socket is immediate.
const listenProbeTimeout = 200 * time.Millisecond

var (
	errKubeletNotFound = errors.New("the kubelet does not know the pod")
	errKubeletClosed   = errors.New("podgate is stopping")
	// errNoKubelet: the kubelet's socket does not exist. With no kubelet there are no
	// kubelet devices to miss, and podgate answers with its own part.
	errNoKubelet = errors.New("no kubelet PodResources socket")
	// errNotListening: the kubelet's socket refuses connections.
	errNotListening = errors.New("nobody listens on the socket (connection refused): a kubelet that stopped left it behind")
)

// kubeletCallError is a failed call to the kubelet, with its result label.
type kubeletCallError struct {
	socket, method, result string
	err                    error
}

func (e *kubeletCallError) Error() string {
	return fmt.Sprintf("%s on the kubelet's PodResources socket %s: %v", e.method, e.socket, e.err)
}
func (e *kubeletCallError) Unwrap() error { return e.err }

// retryable reports whether a failed kubelet call may succeed if made again soon: the kubelet
// was over its rate limit (other clients share it), restarting or slow.
func retryable(err error) bool {
	r := callResult(err)
	return r == kubeletRefused || r == kubeletUnavailable || r == kubeletNotListening
}

// callResult is the result label of a failed kubelet call; "" for another error.
func callResult(err error) string {
	if ce, ok := errors.AsType[*kubeletCallError](err); ok {
		return ce.result
	}
	return ""
}

// kubeletClient calls the kubelet's own PodResources socket, whose devices, CPUs and memory
// podgate merges into its answers. Its List, Get and GetAllocatableResources coalesce
// concurrent callers (flightGroup), keep within podgate's own token bucket, and wait for the
// kubelet within the caller's deadline: they return an answer, errNoKubelet (no socket), or
// an error saying why the kubelet's answer is missing.
type kubeletClient struct {
	socket  string
	metrics *metrics
	limiter *rate.Limiter
	slots   chan struct{} // one per call in flight, burst in all
	qps     float64
	burst   int
	maxWait time.Duration
	// callTimeout bounds each call: kubeletCallTimeout.
	callTimeout time.Duration

	// ctx is the flights' parent, cancelled by Close; wg counts the flights.
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	lists  *flightGroup[struct{}, *v1.ListPodResourcesResponse]
	gets   *flightGroup[podKey, getResult]
	allocs *flightGroup[struct{}, *v1.AllocatableResourcesResponse]

	mu     sync.Mutex
	conn   *grpc.ClientConn
	client v1.PodResourcesListerClient
	// health is the result of the last call, so that a change is logged once each way.
	health string
	// failures counts the calls in a row that failed and may pass (retryable), the last at
	// lastFailure with lastErr: the next call waits retryDelay.
	failures    int
	lastFailure time.Time
	lastErr     error
	// closed: Close ran; no flight starts and no connection is made.
	closed bool
}

// newKubeletClient returns a client for the kubelet's PodResources socket at path, which
// sends at most qps calls a second with bursts of burst; it connects on first use.
func newKubeletClient(path string, m *metrics, qps float64, burst int) *kubeletClient {
	m.kubeletUp.Set(1) // until a call says otherwise, as health starts ok
	k := &kubeletClient{
		socket: path, metrics: m, limiter: rate.NewLimiter(rate.Limit(qps), burst), slots: make(chan struct{}, burst), qps: qps, burst: burst,
		maxWait: maxKubeletWait, callTimeout: kubeletCallTimeout, health: kubeletOK,
	}
	k.ctx, k.cancel = context.WithCancelCause(context.Background())
	k.lists = newFlightGroup(k, "List", func(ctx context.Context, _ struct{}) (*v1.ListPodResourcesResponse, error) {
		return kubeletCall(ctx, k, "List", func(ctx context.Context, c v1.PodResourcesListerClient) (*v1.ListPodResourcesResponse, error) {
			return c.List(ctx, &v1.ListPodResourcesRequest{})
		})
	})
	k.gets = newFlightGroup(k, "Get", func(ctx context.Context, key podKey) (getResult, error) {
		resp, err := kubeletCall(ctx, k, "Get", func(ctx context.Context, c v1.PodResourcesListerClient) (*v1.GetPodResourcesResponse, error) {
			return c.Get(ctx, &v1.GetPodResourcesRequest{PodName: key.name, PodNamespace: key.namespace})
		})
		if errors.Is(err, errKubeletNotFound) {
			return getResult{}, nil
		}
		return getResult{pod: resp.GetPodResources(), found: resp.GetPodResources() != nil}, err
	})
	k.allocs = newFlightGroup(k, "GetAllocatableResources", func(ctx context.Context, _ struct{}) (*v1.AllocatableResourcesResponse, error) {
		return kubeletCall(ctx, k, "GetAllocatableResources", func(ctx context.Context, c v1.PodResourcesListerClient) (*v1.AllocatableResourcesResponse, error) {
			return c.GetAllocatableResources(ctx, &v1.AllocatableResourcesRequest{})
		})
	})
	return k
}

// List returns the kubelet's List answer, from a call sent after List was called.
func (k *kubeletClient) List(ctx context.Context) (*v1.ListPodResourcesResponse, error) {
	return k.lists.do(ctx, struct{}{})
}

// Get returns the kubelet's Get answer, from a call sent after Get was called; found is
// false, with no error, when the kubelet does not know the pod.
func (k *kubeletClient) Get(ctx context.Context, namespace, name string) (pr *v1.PodResources, found bool, err error) {
	r, err := k.gets.do(ctx, podKey{namespace: namespace, name: name})
	return r.pod, r.found, err
}

// KnowsPod is Get for a decision that must not wait for a kubelet that is not there: when
// nobody listens on the socket (connection refused: a kubelet that stopped or died left it
// behind) it ends at once with an error whose result is kubeletNotListening, instead of
// trying again within Get's wait, which is kept for a kubelet that is there (over its rate
// limit, or slow). After such a failure, the next KnowsPod connects to the socket first, and
// asks only when something listens again.
func (k *kubeletClient) KnowsPod(ctx context.Context, namespace, name string) (bool, error) {
	if k.lastResult() == kubeletNotListening {
		if err := k.notListening(ctx, "Get"); err != nil {
			return false, err
		}
	}
	r, err := k.gets.doUntil(ctx, podKey{namespace: namespace, name: name}, func(err error) bool {
		return callResult(err) == kubeletNotListening
	})
	return r.found, err
}

// GetAllocatableResources returns the kubelet's GetAllocatableResources answer.
func (k *kubeletClient) GetAllocatableResources(ctx context.Context) (*v1.AllocatableResourcesResponse, error) {
	return k.allocs.do(ctx, struct{}{})
}

func (k *kubeletClient) lister() (v1.PodResourcesListerClient, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil, errKubeletClosed
	}
	if k.client != nil {
		return k.client, nil
	}
	conn, err := grpc.NewClient("unix://"+k.socket,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize)),
		// A restarted kubelet is back within seconds; grpc's default backoff (up to two
		// minutes) would keep podgate from asking it for that long.
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{
			BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second,
		}, MinConnectTimeout: time.Second}),
	)
	if err != nil {
		return nil, err
	}
	k.conn, k.client = conn, v1.NewPodResourcesListerClient(conn)
	return k.client, nil
}

// startFlight counts a flight about to start; false once Close ran.
func (k *kubeletClient) startFlight() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false
	}
	k.wg.Add(1)
	return true
}

// Close ends the calls waiting to be sent, waits for those sent, and closes the connection.
func (k *kubeletClient) Close() error {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	k.cancel(errKubeletClosed)
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.conn == nil {
		return nil
	}
	err := k.conn.Close()
	k.conn, k.client = nil, nil
	return err
}

// throttle waits for one of the burst slots of calls in flight, then for a token of the
// bucket; release gives the slot back once the call is answered. The bucket alone bounds when
// calls may start, not when they reach the kubelet: calls delayed between their token and
// their send (a busy node) would reach it together. With at most burst calls in flight, the
// kubelet sees at most 2×burst + qps×t calls in any t seconds — within its own bucket when
// podgate's is at most half of it, as by default.
func (k *kubeletClient) throttle(ctx context.Context) (release func(), err error) {
	select {
	case k.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
	if err := k.limiter.Wait(ctx); err != nil {
		<-k.slots
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause
		}
		return nil, err
	}
	return func() { <-k.slots }, nil
}

// retryDelay is how long the next call waits after failures in a row that may pass, and the
// last of them.
func (k *kubeletClient) retryDelay() (time.Duration, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failures == 0 {
		return 0, nil
	}
	d := maxRetryDelay
	if k.failures < 6 {
		d = min(minRetryDelay<<(k.failures-1), maxRetryDelay)
	}
	return d - time.Since(k.lastFailure), k.lastErr
}

// lastResult is the result of the last call to the kubelet (its health: ok for an answer).
func (k *kubeletClient) lastResult() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.health
}

// listening reports whether anything accepts connections on the kubelet's socket. Only a
// refused connection (ECONNREFUSED: a socket file nobody listens on) says no; any other
// failure says nothing, and counts as listening.
func (k *kubeletClient) listening(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, listenProbeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", k.socket)
	if err != nil {
		return !errors.Is(err, syscall.ECONNREFUSED)
	}
	_ = c.Close() // a probe: nothing was sent
	return true
}

// notListening checks, without a call, that something listens on the kubelet's socket; when
// nobody does, the call is counted as not_listening and fails so.
func (k *kubeletClient) notListening(ctx context.Context, method string) error {
	if k.listening(ctx) {
		return nil
	}
	k.metrics.kubeletRequests.WithLabelValues(method, kubeletNotListening).Inc()
	k.noteHealth(ctx, kubeletNotListening, errNotListening)
	return &kubeletCallError{socket: k.socket, method: method, result: kubeletNotListening, err: errNotListening}
}

// present checks that the kubelet's socket exists; when it does not, the call is counted as
// absent and fails with errNoKubelet.
func (k *kubeletClient) present(ctx context.Context, method string) error {
	_, err := os.Stat(k.socket)
	if !errors.Is(err, os.ErrNotExist) {
		return nil // another error: the call will say it
	}
	k.metrics.kubeletRequests.WithLabelValues(method, kubeletAbsent).Inc()
	err = fmt.Errorf("%w %s", errNoKubelet, k.socket)
	k.noteHealth(ctx, kubeletAbsent, err)
	return err
}

// kubeletCall makes one call with its timeout, counts it, and logs when the kubelet stops or
// starts answering. An error is a *kubeletCallError, errKubeletNotFound, or ctx's cause.
func kubeletCall[T any](ctx context.Context, k *kubeletClient, method string, call func(context.Context, v1.PodResourcesListerClient) (T, error)) (T, error) {
	var zero T
	result, err := func() (T, error) {
		c, err := k.lister()
		if err != nil {
			return zero, fmt.Errorf("kubelet PodResources socket %s: %w", k.socket, err)
		}
		ctx, cancel := context.WithTimeout(ctx, k.callTimeout)
		defer cancel()
		return call(ctx, c)
	}()
	outcome := kubeletOK
	switch {
	case err == nil:
	case method == "Get" && isKubeletNotFound(err):
		outcome, err = kubeletNotFound, errKubeletNotFound
	case ctx.Err() != nil:
		// podgate is stopping: says nothing of the kubelet.
		if cause := context.Cause(ctx); cause != nil {
			return zero, cause
		}
		return zero, err
	case status.Code(err) == codes.ResourceExhausted:
		outcome = kubeletRefused
	case status.Code(err) == codes.Unavailable && !k.listening(ctx):
		outcome, err = kubeletNotListening, fmt.Errorf("%w: %w", errNotListening, err)
	case status.Code(err) == codes.Unavailable, status.Code(err) == codes.DeadlineExceeded:
		outcome = kubeletUnavailable
	default:
		outcome = kubeletError
	}
	k.metrics.kubeletRequests.WithLabelValues(method, outcome).Inc()
	k.noteHealth(ctx, outcome, err)
	if outcome != kubeletOK && outcome != kubeletNotFound {
		err = &kubeletCallError{socket: k.socket, method: method, result: outcome, err: err}
	}
	return result, err
}

// isKubeletNotFound recognises the kubelet's answer to Get for a pod it does not know: an
// error without a code (codes.Unknown) saying "not found", or NotFound.
func isKubeletNotFound(err error) bool {
	st := status.Convert(err)
	return st.Code() == codes.NotFound || st.Code() == codes.Unknown && containsFold(st.Message(), "not found")
}

// noteHealth records a call's result: kubelet_up, the failures in a row that set the delay
// before the next call, and a log line when the kubelet's state changes.
func (k *kubeletClient) noteHealth(ctx context.Context, outcome string, err error) {
	health := outcome
	switch outcome {
	case kubeletNotFound:
		health = kubeletOK
	case kubeletRefused:
		// Over its rate limit, the kubelet still answers: not worth a log line each way.
		health = kubeletOK
	}
	k.mu.Lock()
	if outcome == kubeletRefused || outcome == kubeletUnavailable || outcome == kubeletNotListening {
		k.failures++
		k.lastFailure, k.lastErr = time.Now(), err
	} else {
		k.failures, k.lastErr = 0, nil
	}
	changed := health != k.health
	k.health = health
	k.mu.Unlock()
	k.metrics.kubeletUp.Set(boolFloat(health == kubeletOK))
	if !changed {
		return
	}
	logger := klog.FromContext(ctx)
	switch health {
	case kubeletOK:
		logger.Info("The kubelet's PodResources socket answers again", "socket", k.socket)
	case kubeletAbsent:
		logger.Info("No kubelet PodResources socket; serving what podgate knows, without a kubelet's devices, CPUs and memory",
			"socket", k.socket)
	case kubeletNotListening:
		logger.Info("Nobody listens on the kubelet's PodResources socket (a kubelet that stopped left it behind); v1 calls wait for a kubelet within their deadline, then fail Unavailable; DRA decisions do not wait",
			"socket", k.socket)
	default:
		logger.Info("The kubelet's PodResources socket does not answer; v1 calls wait for it within their deadline, then fail Unavailable",
			"socket", k.socket, "err", err)
	}
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

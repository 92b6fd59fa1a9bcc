package dra

import (
	"context"
	"fmt"
	"net"
	"slices"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
)

// supportedServices are the DRA gRPC services podgate speaks, most preferred first, as the
// kubelet prefers them.
var supportedServices = []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService}

// chooseService picks the service podgate uses from those a driver advertises ("" if none).
func chooseService(advertised []string) string {
	for _, s := range supportedServices {
		if slices.Contains(advertised, s) {
			return s
		}
	}
	return ""
}

// Claim is a ResourceClaim as a driver call names it.
type Claim struct {
	// Namespace and Name are the ResourceClaim's.
	Namespace string
	Name      string
	// UID is the ResourceClaim's UID, by which drivers key their answers.
	UID types.UID
}

// String returns namespace/name.
func (c Claim) String() string { return c.Namespace + "/" + c.Name }

// Device is a device a driver prepared for a claim.
type Device struct {
	// Requests are the claim's requests the device serves; none means all of them.
	Requests []string
	// Pool and Name identify the device in the driver's ResourceSlices.
	Pool string
	Name string
	// CDIDeviceIDs are the CDI devices the runtime injects for it; there may be none.
	CDIDeviceIDs []string
	// ShareID identifies the share of a device that several claims use at once; empty when
	// the device is not shared (and always from a v1beta1 driver, whose API has no such field).
	ShareID string
}

// PrepareResult is a driver's answer for one claim.
type PrepareResult struct {
	// Devices are the claim's prepared devices.
	Devices []Device
	// Err is the driver's failure for this claim, an [*Error]; nil when the claim is prepared.
	Err error
}

// Preparer prepares claims with their DRA driver.
type Preparer interface {
	// Prepare prepares claims; see [Driver.Prepare].
	Prepare(ctx context.Context, claims []Claim) (map[types.UID]PrepareResult, error)
}

// Unpreparer releases prepared claims with their DRA driver.
type Unpreparer interface {
	// Unprepare releases claims; see [Driver.Unprepare].
	Unprepare(ctx context.Context, claims []Claim) (map[types.UID]error, error)
}

var (
	_ Preparer   = (*Driver)(nil)
	_ Unpreparer = (*Driver)(nil)
)

// Driver is one registration of a DRA driver on the node, and the client of its DRA service.
// It is a snapshot: when the driver re-registers, [Drivers] holds a new Driver, and when the
// driver is forgotten this one's calls fail. Look the driver up for each operation.
type Driver struct {
	name     string
	endpoint string
	socket   string
	versions []string
	service  string
	conn     *grpc.ClientConn // shared by every Driver on this endpoint
	client   drapbv1.DRAPluginClient
	timeout  time.Duration
	metrics  *metrics
}

// newDriver returns the client of reg's DRA service over conn.
func newDriver(reg *registration, conn *grpc.ClientConn, timeout time.Duration, m *metrics) *Driver {
	client := drapbv1.NewDRAPluginClient(conn)
	if reg.service == drapbv1beta1.DRAPluginService {
		// The v1beta1 messages are v1's (less ShareId); the wrapper converts both ways.
		client = drapbv1beta1.V1Beta1ClientWrapper{DRAPluginClient: drapbv1beta1.NewDRAPluginClient(conn)}
	}
	return &Driver{
		name:     reg.name,
		endpoint: reg.endpoint,
		socket:   reg.socket,
		versions: reg.versions,
		service:  reg.service,
		conn:     conn,
		client:   client,
		timeout:  timeout,
		metrics:  m,
	}
}

// AnswerTimeout bounds [Driver.Answers]: a driver that runs accepts a connection at once, and
// one that is gone refuses it at once.
const AnswerTimeout = 5 * time.Second

// Answers returns nil when the driver's DRA service accepts a connection on its socket, and an
// [Error] of class errdefs.ErrUnavailable when it does not. A driver that was killed leaves its
// sockets behind, and so its registration: only a connection tells that nobody serves it any
// more. Answers calls no method: the DRA service has none that asks a driver whether it is
// well, and a prepare is not podgate's to make when the kubelet prepares.
func (d *Driver) Answers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, AnswerTimeout)
	defer cancel()
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "unix", d.endpoint)
	if err != nil {
		return &Error{
			Driver: d.name,
			msg:    fmt.Sprintf("DRA driver %s does not answer on %s: %v", d.name, d.endpoint, err),
			class:  errdefs.ErrUnavailable,
		}
	}
	return conn.Close()
}

// Name returns the driver's name, e.g. "net.example.com".
func (d *Driver) Name() string { return d.name }

// Endpoint returns the path of the driver's DRA service socket.
func (d *Driver) Endpoint() string { return d.endpoint }

// RegistrationSocket returns the path of the registration socket the driver was found on.
func (d *Driver) RegistrationSocket() string { return d.socket }

// Versions returns the gRPC services the driver advertised ("supported versions"), e.g.
// "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth".
func (d *Driver) Versions() []string { return slices.Clone(d.versions) }

// Service returns the DRA service podgate calls: "v1.DRAPlugin" when the driver serves it,
// else "v1beta1.DRAPlugin".
func (d *Driver) Service() string { return d.service }

// sameAs reports whether d is what reg describes.
func (d *Driver) sameAs(reg *registration) bool {
	return d.name == reg.name && d.endpoint == reg.endpoint && d.service == reg.service &&
		slices.Equal(d.versions, reg.versions)
}

// Prepare asks the driver to prepare claims (NodePrepareResources) and returns its answer for
// each of them, by UID. The call has the driver's call timeout. Preparing is idempotent on the
// driver's side, so a repeated call is passed on as it is.
//
// When the call fails as a whole, the result is nil and the error an [*Error] naming the
// claims and the driver. When the driver answers but fails some claims (or leaves them out of
// its answer), every claim still has its result, the failed ones with their Err, and the error
// joins those claims' errors. An empty claims list makes no call.
func (d *Driver) Prepare(ctx context.Context, claims []Claim) (map[types.UID]PrepareResult, error) {
	if len(claims) == 0 {
		return map[types.UID]PrepareResult{}, nil
	}
	if err := checkClaims(opPrepare, claims); err != nil {
		return nil, err
	}
	start := time.Now()
	resp, result, err := invoke(ctx, d, opPrepare, claims, func(ctx context.Context) (*drapbv1.NodePrepareResourcesResponse, error) {
		return d.client.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: pbClaims(claims)})
	})
	if err != nil {
		d.done(ctx, opPrepare, result, start, err)
		return nil, err
	}
	answers := resp.GetClaims()
	results := make(map[types.UID]PrepareResult, len(claims))
	var errs []error
	for _, c := range claims {
		a, ok := answers[string(c.UID)]
		switch {
		case !ok || a == nil:
			err = claimError(errdefs.ErrUnavailable, d.name, opPrepare, c, "no answer for the claim in NodePrepareResources")
		case a.GetError() != "":
			err = claimError(errdefs.ErrUnavailable, d.name, opPrepare, c, "%s", a.GetError())
		default:
			results[c.UID] = PrepareResult{Devices: devices(a.GetDevices())}
			continue
		}
		results[c.UID] = PrepareResult{Err: err}
		errs = append(errs, err)
	}
	d.warnUnasked(ctx, opPrepare, unasked(claims, answers))
	err = joinClaimErrors(errs)
	d.done(ctx, opPrepare, claimResult(err), start, err)
	return results, err
}

// Unprepare asks the driver to release claims (NodeUnprepareResources) and returns its answer
// for each of them by UID, nil for a released claim. Releasing a claim the driver does not hold
// is the driver's to accept (drivers must be idempotent). Failures are reported as by
// [Driver.Prepare].
func (d *Driver) Unprepare(ctx context.Context, claims []Claim) (map[types.UID]error, error) {
	if len(claims) == 0 {
		return map[types.UID]error{}, nil
	}
	if err := checkClaims(opUnprepare, claims); err != nil {
		return nil, err
	}
	start := time.Now()
	resp, result, err := invoke(ctx, d, opUnprepare, claims, func(ctx context.Context) (*drapbv1.NodeUnprepareResourcesResponse, error) {
		return d.client.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: pbClaims(claims)})
	})
	if err != nil {
		d.done(ctx, opUnprepare, result, start, err)
		return nil, err
	}
	answers := resp.GetClaims()
	results := make(map[types.UID]error, len(claims))
	var errs []error
	for _, c := range claims {
		a, ok := answers[string(c.UID)]
		switch {
		case !ok || a == nil:
			err = claimError(errdefs.ErrUnavailable, d.name, opUnprepare, c, "no answer for the claim in NodeUnprepareResources")
		case a.GetError() != "":
			err = claimError(errdefs.ErrUnavailable, d.name, opUnprepare, c, "%s", a.GetError())
		default:
			results[c.UID] = nil
			continue
		}
		results[c.UID] = err
		errs = append(errs, err)
	}
	d.warnUnasked(ctx, opUnprepare, unasked(claims, answers))
	err = joinClaimErrors(errs)
	d.done(ctx, opUnprepare, claimResult(err), start, err)
	return results, err
}

// invoke makes one call to the driver under the call timeout and turns a failure into an
// [*Error], with the result label for the metrics.
func invoke[R any](ctx context.Context, d *Driver, op string, claims []Claim, call func(context.Context) (R, error)) (R, string, error) {
	// Every call has a deadline of its own (DefaultCallTimeout, the kubelet's): a driver that
	// hangs must not hold the sandbox pipeline, and a stuck prepare must leave the undo path
	// its own attempt, whatever deadline the caller has.
	callCtx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	resp, err := call(callCtx)
	if err == nil {
		return resp, resultSuccess, nil
	}
	var zero R
	switch {
	case ctx.Err() != nil:
		return zero, resultCanceled, callError(ctx.Err(), d.name, op, claims, "caller gave up: %v", context.Cause(ctx))
	case callCtx.Err() != nil || status.Code(err) == codes.DeadlineExceeded:
		// The driver may see the deadline (which gRPC sends along) expire before podgate does,
		// and end the call with DeadlineExceeded first.
		return zero, resultTimeout, callError(errdefs.ErrUnavailable, d.name, op, claims, "timed out (call timeout %s): %s", d.timeout, describe(err))
	case d.conn.GetState() == connectivity.Shutdown:
		return zero, resultError, callError(errdefs.ErrUnavailable, d.name, op, claims, "the driver left the plugin registry")
	default:
		return zero, resultError, callError(errdefs.ErrUnavailable, d.name, op, claims, "%s", describe(err))
	}
}

// describe flattens a gRPC failure into text, so that the driver's status does not reach the
// CRI boundary as a status of its own (see [Error]).
func describe(err error) string {
	if st, ok := status.FromError(err); ok {
		return fmt.Sprintf("%s (code %s)", st.Message(), st.Code())
	}
	return err.Error()
}

// done records a call in the metrics and the log.
func (d *Driver) done(ctx context.Context, op, result string, start time.Time, err error) {
	d.metrics.observe(d.name, op, result, start)
	logger := klog.FromContext(ctx)
	if logger.V(3).Enabled() {
		logger.V(3).Info("DRA driver call done", "driver", d.name, "operation", op, "service", d.service,
			"result", result, "duration", time.Since(start), "err", err)
	}
}

// warnUnasked logs an answer that holds claims podgate did not ask about: a driver bug that
// harms nothing podgate asked for, so it is no failure.
func (d *Driver) warnUnasked(ctx context.Context, op string, uids []string) {
	if len(uids) > 0 {
		klog.FromContext(ctx).Info("DRA driver answered for claims it was not asked about", "driver", d.name,
			"operation", op, "uids", uids)
	}
}

// unasked returns the UIDs in answers that are not those of claims.
func unasked[V any](claims []Claim, answers map[string]V) []string {
	var uids []string
	for uid := range answers {
		if !slices.ContainsFunc(claims, func(c Claim) bool { return string(c.UID) == uid }) {
			uids = append(uids, uid)
		}
	}
	return uids
}

func claimResult(err error) string {
	if err != nil {
		return resultClaimError
	}
	return resultSuccess
}

// checkClaims refuses claims without a UID: drivers key their answers by UID.
func checkClaims(op string, claims []Claim) error {
	for _, c := range claims {
		if c.UID == "" {
			return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf("%s claim %s: no UID", op, c))
		}
	}
	return nil
}

func pbClaims(claims []Claim) []*drapbv1.Claim {
	pb := make([]*drapbv1.Claim, len(claims))
	for i, c := range claims {
		pb[i] = &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
	}
	return pb
}

func devices(pb []*drapbv1.Device) []Device {
	if len(pb) == 0 {
		return nil
	}
	ds := make([]Device, len(pb))
	for i, p := range pb {
		ds[i] = Device{
			Requests:     p.GetRequestNames(),
			Pool:         p.GetPoolName(),
			Name:         p.GetDeviceName(),
			CDIDeviceIDs: p.GetCdiDeviceIds(),
			ShareID:      p.GetShareId(),
		}
	}
	return ds
}

package dratest

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Driver is a fake DRA driver. Every prepared claim gets one device, [Device] of the claim's
// name; unprepare succeeds for any claim, prepared or not, as unprepare is idempotent.
type Driver struct {
	drapbv1.UnimplementedDRAPluginServer

	// Name is the driver's name.
	Name string
	// Endpoint is its DRA service's socket; RegistrationSocket its registration socket, empty
	// with WithoutRegistration.
	Endpoint, RegistrationSocket string

	reg              *Registration
	stopReg, stopDRA func()

	mu      sync.Mutex
	calls   []string
	methods []string
	// hook, when set, runs first in every call; its error fails the call.
	hook func(ctx context.Context, op string) error
	// Per claim (namespace/name): the driver's error for it, or left out of the answers.
	failPrepare, failUnprepare map[string]string
	omitted                    map[string]bool
}

var _ drapbv1.DRAPluginServer = (*Driver)(nil)

// Option configures a Driver at Start.
type Option func(*options)

type options struct {
	services            []string
	versions            []string
	versionsSet         bool
	pluginType          string
	regFile, draFile    string
	withoutRegistration bool
}

// WithServices sets the DRA services the driver serves, of drapbv1.DRAPluginService and
// drapbv1beta1.DRAPluginService; by default both, as kubeletplugin serves them.
func WithServices(services ...string) Option {
	return func(o *options) { o.services = services }
}

// WithVersions sets the versions its registration advertises in GetInfo (none at all if
// called without any); by default the services it serves.
func WithVersions(versions ...string) Option {
	return func(o *options) { o.versions, o.versionsSet = versions, true }
}

// WithPluginType sets the plugin type its registration advertises; by default
// registerapi.DRAPlugin.
func WithPluginType(typ string) Option {
	return func(o *options) { o.pluginType = typ }
}

// WithSocketNames names its registration socket in the registry directory and its DRA socket
// in the plugin directory; by default <name>-reg.sock and <name>.sock.
func WithSocketNames(registration, dra string) Option {
	return func(o *options) { o.regFile, o.draFile = registration, dra }
}

// WithoutRegistration serves the DRA service alone, for a test that serves a registration of
// its own (NewRegistration) in front of it.
func WithoutRegistration() Option {
	return func(o *options) { o.withoutRegistration = true }
}

// Start serves a driver named name until the test ends or Stop is called: its DRA service on a
// socket in pluginDir first, then its registration socket in registryDir, as kubeletplugin
// does. Keep the directories short: they hold unix sockets.
func Start(t testing.TB, registryDir, pluginDir, name string, opts ...Option) *Driver {
	t.Helper()
	o := options{
		services:   []string{drapbv1.DRAPluginService, drapbv1beta1.DRAPluginService},
		pluginType: registerapi.DRAPlugin,
		regFile:    name + "-reg.sock",
		draFile:    name + ".sock",
	}
	for _, opt := range opts {
		opt(&o)
	}
	if !o.versionsSet {
		o.versions = o.services
	}
	d := &Driver{
		Name:          name,
		Endpoint:      filepath.Join(pluginDir, o.draFile),
		stopReg:       func() {},
		failPrepare:   map[string]string{},
		failUnprepare: map[string]string{},
		omitted:       map[string]bool{},
	}
	d.stopDRA = serve(t, d.Endpoint, func(s *grpc.Server) {
		for _, svc := range o.services {
			switch svc {
			case drapbv1.DRAPluginService:
				drapbv1.RegisterDRAPluginServer(s, d)
			case drapbv1beta1.DRAPluginService:
				drapbv1beta1.RegisterDRAPluginServer(s, drapbv1beta1.V1ServerWrapper{DRAPluginServer: d})
			default:
				t.Fatalf("dratest: no DRA service %q", svc)
			}
		}
	}, grpc.ChainUnaryInterceptor(d.recordMethod))
	if !o.withoutRegistration {
		d.RegistrationSocket = filepath.Join(registryDir, o.regFile)
		d.reg = NewRegistration(&registerapi.PluginInfo{
			Type:              o.pluginType,
			Name:              name,
			Endpoint:          d.Endpoint,
			SupportedVersions: o.versions,
		})
		d.stopReg = d.reg.Serve(t, d.RegistrationSocket)
	}
	return d
}

// Stop stops serving: the registration socket and the DRA socket go away.
func (d *Driver) Stop() { d.stopReg(); d.stopDRA() }

// StopRegistration stops the registration socket alone, as a driver leaving the registry.
func (d *Driver) StopRegistration() { d.stopReg() }

// StopDRA stops the DRA service alone, as a driver whose registration outlived it.
func (d *Driver) StopDRA() { d.stopDRA() }

// Registration is the driver's registration service, nil with WithoutRegistration.
func (d *Driver) Registration() *Registration { return d.reg }

// SetHook makes every later call run hook first, after the call is recorded; its error fails
// the call. op is "prepare" or "unprepare". nil removes it.
func (d *Driver) SetHook(hook func(ctx context.Context, op string) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hook = hook
}

// FailClaim makes the preparation of claim namespace/name fail with msg.
func (d *Driver) FailClaim(namespace, name, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failPrepare[namespace+"/"+name] = msg
}

// FailUnprepare makes the unpreparation of claim namespace/name fail with msg.
func (d *Driver) FailUnprepare(namespace, name, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failUnprepare[namespace+"/"+name] = msg
}

// OmitClaim leaves claim namespace/name out of the driver's answers, prepare and unprepare.
func (d *Driver) OmitClaim(namespace, name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.omitted[namespace+"/"+name] = true
}

// Calls returns the calls so far, in order: "prepare ns/name" or "unprepare ns/name", one per
// claim.
func (d *Driver) Calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// Methods returns the full gRPC method names the DRA service was called with, in order, to
// tell which service (v1, v1beta1) a call used.
func (d *Driver) Methods() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.methods)
}

// Device is the device the driver prepares for a claim.
func Device(claimName string) *drapbv1.Device {
	return &drapbv1.Device{RequestNames: []string{"req"}, PoolName: "pool", DeviceName: "dev-" + claimName, CdiDeviceIds: []string{"example.com/net=" + claimName}}
}

func (d *Driver) recordMethod(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	d.mu.Lock()
	d.methods = append(d.methods, info.FullMethod)
	d.mu.Unlock()
	return handler(ctx, req)
}

func (d *Driver) record(ctx context.Context, op string, claims []*drapbv1.Claim) error {
	d.mu.Lock()
	hook := d.hook
	for _, c := range claims {
		d.calls = append(d.calls, op+" "+c.GetNamespace()+"/"+c.GetName())
	}
	d.mu.Unlock()
	if hook != nil {
		return hook(ctx, op)
	}
	return nil
}

// NodePrepareResources implements the DRA v1 service.
func (d *Driver) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	if err := d.record(ctx, "prepare", req.GetClaims()); err != nil {
		return nil, err
	}
	resp := &drapbv1.NodePrepareResourcesResponse{Claims: map[string]*drapbv1.NodePrepareResourceResponse{}}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range req.GetClaims() {
		key := c.GetNamespace() + "/" + c.GetName()
		switch msg, failed := d.failPrepare[key]; {
		case d.omitted[key]:
		case failed:
			resp.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Error: msg}
		default:
			resp.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Devices: []*drapbv1.Device{Device(c.GetName())}}
		}
	}
	return resp, nil
}

// NodeUnprepareResources implements the DRA v1 service.
func (d *Driver) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	if err := d.record(ctx, "unprepare", req.GetClaims()); err != nil {
		return nil, err
	}
	resp := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{}}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range req.GetClaims() {
		key := c.GetNamespace() + "/" + c.GetName()
		switch msg, failed := d.failUnprepare[key]; {
		case d.omitted[key]:
		case failed:
			resp.Claims[c.GetUid()] = &drapbv1.NodeUnprepareResourceResponse{Error: msg}
		default:
			resp.Claims[c.GetUid()] = &drapbv1.NodeUnprepareResourceResponse{}
		}
	}
	return resp, nil
}

// Package dratest serves fake DRA drivers for tests: a real DRA v1 gRPC server and a real
// registration socket in a plugin registry directory, as a driver built with the upstream
// kubeletplugin helper would serve them, with the calls it got recorded and hooks to make it
// slow or failing.
package dratest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Driver is a fake DRA driver. Every prepared claim gets one device, "dev-<claim name>" in
// pool "pool", serving request "req", with one CDI device ID.
type Driver struct {
	drapbv1.UnimplementedDRAPluginServer

	// Name is the driver's name.
	Name string
	// Endpoint is its DRA service's socket; RegistrationSocket its registration socket.
	Endpoint, RegistrationSocket string

	mu    sync.Mutex
	calls []string
	// hook, when set, runs first in every call; its error fails the call.
	hook func(ctx context.Context, op string) error
	// failClaim names claims (namespace/name) whose preparation fails.
	failClaim map[string]string
	stop      func()
}

// Start serves a driver named name, registering it in registryDir with its DRA socket in
// pluginDir, until the test ends or Stop is called. Keep the directories short: they hold unix
// sockets.
func Start(t testing.TB, registryDir, pluginDir, name string) *Driver {
	t.Helper()
	d := &Driver{
		Name:               name,
		Endpoint:           filepath.Join(pluginDir, name+".sock"),
		RegistrationSocket: filepath.Join(registryDir, name+"-reg.sock"),
		failClaim:          map[string]string{},
	}
	stopDRA := serve(t, d.Endpoint, func(s *grpc.Server) { drapbv1.RegisterDRAPluginServer(s, d) })
	stopReg := serve(t, d.RegistrationSocket, func(s *grpc.Server) {
		registerapi.RegisterRegistrationServer(s, &registration{info: &registerapi.PluginInfo{
			Type: registerapi.DRAPlugin, Name: name, Endpoint: d.Endpoint,
			SupportedVersions: []string{drapbv1.DRAPluginService},
		}})
	})
	d.stop = sync.OnceFunc(func() { stopReg(); stopDRA() })
	t.Cleanup(d.stop)
	return d
}

// Stop stops serving: the registration socket and the DRA socket go away.
func (d *Driver) Stop() { d.stop() }

// SetHook makes every later call run hook first; its error fails the call. nil removes it.
func (d *Driver) SetHook(hook func(ctx context.Context, op string) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hook = hook
}

// FailClaim makes the preparation of claim namespace/name fail with msg.
func (d *Driver) FailClaim(namespace, name, msg string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failClaim[namespace+"/"+name] = msg
}

// Calls returns the calls so far, in order: "prepare ns/name" or "unprepare ns/name", one per
// claim.
func (d *Driver) Calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// Device is the device the driver prepares for a claim.
func Device(claimName string) *drapbv1.Device {
	return &drapbv1.Device{RequestNames: []string{"req"}, PoolName: "pool", DeviceName: "dev-" + claimName, CdiDeviceIds: []string{"example.com/net=" + claimName}}
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
		if msg, ok := d.failClaim[c.GetNamespace()+"/"+c.GetName()]; ok {
			resp.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Error: msg}
			continue
		}
		resp.Claims[c.GetUid()] = &drapbv1.NodePrepareResourceResponse{Devices: []*drapbv1.Device{Device(c.GetName())}}
	}
	return resp, nil
}

// NodeUnprepareResources implements the DRA v1 service.
func (d *Driver) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	if err := d.record(ctx, "unprepare", req.GetClaims()); err != nil {
		return nil, err
	}
	resp := &drapbv1.NodeUnprepareResourcesResponse{Claims: map[string]*drapbv1.NodeUnprepareResourceResponse{}}
	for _, c := range req.GetClaims() {
		resp.Claims[c.GetUid()] = &drapbv1.NodeUnprepareResourceResponse{}
	}
	return resp, nil
}

type registration struct {
	registerapi.UnimplementedRegistrationServer
	info *registerapi.PluginInfo
}

func (r *registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return r.info, nil
}

func (r *registration) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serve serves a gRPC server on a new unix socket at path; the returned function stops it and
// removes the socket.
func serve(t testing.TB, path string, register func(*grpc.Server)) func() {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l) // ends with Stop
	}()
	return sync.OnceFunc(func() {
		srv.Stop()
		<-done
		_ = os.Remove(path) // Stop closed the listener, which removes it; make sure
	})
}

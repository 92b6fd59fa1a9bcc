package dratest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registration is a plugin's registration service: it answers GetInfo with its PluginInfo, or
// with the error SetErr gave. A NotifyRegistrationStatus fails the test when the socket stops:
// confirming a registration is the kubelet's, never podgate's.
type Registration struct {
	registerapi.UnimplementedRegistrationServer

	mu    sync.Mutex
	info  *registerapi.PluginInfo
	err   error
	calls int

	notified atomic.Int32
}

var _ registerapi.RegistrationServer = (*Registration)(nil)

// NewRegistration returns a registration service answering info; Serve serves it.
func NewRegistration(info *registerapi.PluginInfo) *Registration {
	return &Registration{info: info}
}

// Serve serves r on a new unix socket at path until the test ends or stop is called; stopping
// closes the listener, which removes the socket file.
func (r *Registration) Serve(t testing.TB, path string) (stop func()) {
	t.Helper()
	stop = serve(t, path, func(s *grpc.Server) { registerapi.RegisterRegistrationServer(s, r) })
	t.Cleanup(func() {
		if n := r.notified.Load(); n != 0 {
			t.Errorf("NotifyRegistrationStatus called %d times on %s; that is the kubelet's", n, path)
		}
	})
	return stop
}

// SetErr makes every later GetInfo fail with err; nil makes it answer again.
func (r *Registration) SetErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err = err
}

// GetInfoCalls returns how many GetInfo calls r got.
func (r *Registration) GetInfoCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// GetInfo implements the registration service.
func (r *Registration) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.err != nil {
		return nil, r.err
	}
	return r.info, nil
}

// NotifyRegistrationStatus implements the registration service.
func (r *Registration) NotifyRegistrationStatus(context.Context, *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.notified.Add(1)
	return &registerapi.RegistrationStatusResponse{}, nil
}

// serve serves a gRPC server on a new unix socket at path until the test ends or the returned
// function is called; stopping closes the listener, which removes the socket file.
func serve(t testing.TB, path string, register func(*grpc.Server), opts ...grpc.ServerOption) (stop func()) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	register(srv)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	stop = sync.OnceFunc(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("serve %s: %v", path, err)
		}
	})
	t.Cleanup(stop)
	return stop
}

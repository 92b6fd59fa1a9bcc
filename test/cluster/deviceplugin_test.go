//go:build linux

package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// devicePlugin is a minimal device plugin: a fixed set of healthy devices of one extended
// resource, which the kubelet allocates to pods and then lists in its PodResources answers under
// the containers that asked, as it does an SR-IOV plugin's VFs. It registers through the
// kubelet's plugin registry (the plugin watcher, type DevicePlugin), whose directory is the
// cluster's own, rather than the fixed /var/lib/kubelet/device-plugins/kubelet.sock that every
// kubelet on the host would share. One socket serves registration and the device plugin API.
type devicePlugin struct {
	dp.UnimplementedDevicePluginServer
	registerapi.UnimplementedRegistrationServer
	resource string
	devices  []string
	socket   string
	srv      *grpc.Server

	mu         sync.Mutex
	registered chan struct{} // closed when the kubelet says the registration succeeded
	regErr     error
	allocated  []string
}

// startDevicePlugin serves a plugin of resource with devices in the kubelet's plugin registry
// dir; it stops when the test ends.
func startDevicePlugin(t testing.TB, registryDir, resource string, devices []string) *devicePlugin {
	t.Helper()
	p := &devicePlugin{
		resource: resource, devices: devices, registered: make(chan struct{}),
		socket: filepath.Join(registryDir, strings.NewReplacer("/", "-", ".", "-").Replace(resource)+".sock"),
	}
	l, err := net.Listen("unix", p.socket)
	if err != nil {
		t.Fatal(err)
	}
	p.srv = grpc.NewServer()
	dp.RegisterDevicePluginServer(p.srv, p)
	registerapi.RegisterRegistrationServer(p.srv, p)
	done := make(chan error, 1)
	go func() { done <- p.srv.Serve(l) }()
	t.Cleanup(func() {
		p.srv.Stop()
		if err := <-done; err != nil {
			t.Errorf("device plugin: Serve: %v", err)
		}
	})
	return p
}

// waitRegistered waits until the kubelet has registered the plugin.
func (p *devicePlugin) waitRegistered(ctx context.Context) error {
	select {
	case <-p.registered:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.regErr
	case <-ctx.Done():
		return fmt.Errorf("device plugin %s: the kubelet did not register it: %w", p.resource, ctx.Err())
	}
}

// GetInfo implements registerapi.RegistrationServer: the kubelet's plugin watcher asks it.
func (p *devicePlugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: p.resource, Endpoint: p.socket, SupportedVersions: []string{dp.Version}}, nil
}

// NotifyRegistrationStatus implements registerapi.RegistrationServer.
func (p *devicePlugin) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.registered:
	default:
		if !st.GetPluginRegistered() {
			p.regErr = fmt.Errorf("device plugin %s: the kubelet refused it: %s", p.resource, st.GetError())
		}
		close(p.registered)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// GetDevicePluginOptions implements dp.DevicePluginServer: no pre-start call, no preferred
// allocation.
func (p *devicePlugin) GetDevicePluginOptions(context.Context, *dp.Empty) (*dp.DevicePluginOptions, error) {
	return &dp.DevicePluginOptions{}, nil
}

// ListAndWatch implements dp.DevicePluginServer: every device healthy, for as long as the
// kubelet watches.
func (p *devicePlugin) ListAndWatch(_ *dp.Empty, stream grpc.ServerStreamingServer[dp.ListAndWatchResponse]) error {
	resp := &dp.ListAndWatchResponse{}
	for _, id := range p.devices {
		resp.Devices = append(resp.Devices, &dp.Device{ID: id, Health: dp.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

// Allocate implements dp.DevicePluginServer: the kubelet calls it when it admits a pod that asks
// for the resource; the container gets the device IDs in an environment variable.
func (p *devicePlugin) Allocate(_ context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	resp := &dp.AllocateResponse{}
	for _, c := range req.GetContainerRequests() {
		if len(c.GetDevicesIds()) == 0 {
			return nil, status.Error(codes.InvalidArgument, "no device asked")
		}
		p.mu.Lock()
		p.allocated = append(p.allocated, c.GetDevicesIds()...)
		p.mu.Unlock()
		resp.ContainerResponses = append(resp.ContainerResponses, &dp.ContainerAllocateResponse{
			Envs: map[string]string{"PODGATE_TEST_DEVICES": strings.Join(c.GetDevicesIds(), ",")},
		})
	}
	return resp, nil
}

// allocatedDevices is the devices the kubelet had the plugin allocate, in order.
func (p *devicePlugin) allocatedDevices() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.allocated)
}

// PreStartContainer implements dp.DevicePluginServer; GetDevicePluginOptions says it is not
// needed.
func (p *devicePlugin) PreStartContainer(context.Context, *dp.PreStartContainerRequest) (*dp.PreStartContainerResponse, error) {
	return nil, errors.New("not asked for")
}

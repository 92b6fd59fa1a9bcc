package dra

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// probeBackoff paces the connection attempts within one look at a registration socket.
var probeBackoff = backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 2, Jitter: 0.2, MaxDelay: time.Second}

// watchSocket asks the registration socket s for its plugin until ctx ends (the socket is
// removed, or Run ends): once, again when its file changes (a poke), and again after a backoff
// while it does not answer. A registration stays until its socket goes, even if a later look
// fails. first is called after the first look.
func (d *Drivers) watchSocket(ctx context.Context, s *regSocket, first func()) {
	defer d.workers.Done()
	defer first()
	logger := klog.FromContext(ctx).WithValues("socket", s.path)
	delay := d.retryInitial
	for {
		info, err := d.getInfo(ctx, s.path)
		if ctx.Err() != nil {
			return
		}
		var retry *time.Timer
		if err != nil {
			d.metrics.discoveryErrors.WithLabelValues(reasonGetInfo).Inc()
			logger.Error(err, "Registration socket did not answer", "retryIn", delay)
			d.event("getinfo_failed", s.path)
			retry = time.NewTimer(delay)
			delay = min(2*delay, d.retryMax)
		} else {
			d.accept(logger, s, info)
		}
		first()
		var wait <-chan time.Time
		if retry != nil {
			wait = retry.C
		}
		select {
		case <-ctx.Done():
		case <-s.kick:
			// The file changed: a fresh start.
			delay = d.retryInitial
		case <-wait:
		}
		if retry != nil {
			retry.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// getInfo asks the registration socket at path what it is. podgate only reads:
// NotifyRegistrationStatus is the kubelet's.
func (d *Drivers) getInfo(ctx context.Context, path string) (*registerapi.PluginInfo, error) {
	// One deadline for connecting and answering (DefaultGetInfoTimeout). Within it the call
	// waits for the socket to accept, trying again quickly: the file appears when the driver
	// binds it, a moment before it listens, and the kubelet too waits for the connection.
	ctx, cancel := context.WithTimeout(ctx, d.getInfoTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix:"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: probeBackoff, MinConnectTimeout: d.getInfoTimeout}))
	if err != nil {
		return nil, fmt.Errorf("registration socket: %w", err)
	}
	defer func() { _ = conn.Close() }()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return nil, fmt.Errorf("GetInfo: %w", err)
	}
	return info, nil
}

// accept applies a GetInfo answer: a usable DRA registration is registered, anything else
// drops what the socket had registered.
func (d *Drivers) accept(logger klog.Logger, s *regSocket, info *registerapi.PluginInfo) {
	reg, ignored, err := d.read(s.path, info)
	if err == nil && reg != nil {
		var unchanged bool
		unchanged, err = d.register(logger, s, reg)
		if err == nil {
			if unchanged {
				d.event("unchanged", s.path)
			} else {
				d.event("registered", s.path)
			}
			return
		}
	}
	if _, rerr := d.register(logger, s, nil); rerr != nil {
		logger.Error(rerr, "Dropping a registration")
	}
	if err != nil {
		d.metrics.discoveryErrors.WithLabelValues(reasonInvalid).Inc()
		logger.Error(err, "Unusable DRA driver registration", "type", info.GetType(), "name", info.GetName(),
			"endpoint", info.GetEndpoint(), "versions", info.GetSupportedVersions())
		d.event("invalid", s.path)
		return
	}
	logger.V(4).Info("Ignoring plugin", "reason", ignored, "type", info.GetType(), "name", info.GetName())
	d.event("ignored", s.path)
}

// read turns a GetInfo answer into a registration. Neither a registration nor an error: the
// plugin is not for podgate, for the reason given.
func (d *Drivers) read(path string, info *registerapi.PluginInfo) (*registration, string, error) {
	if info.GetType() != registerapi.DRAPlugin {
		return nil, "not a DRA driver", nil
	}
	name := info.GetName()
	if name == "" {
		return nil, "", errors.New("DRA registration without a driver name")
	}
	if d.allowed != nil && !d.allowed[name] {
		return nil, "not one of dra.drivers", nil
	}
	service := chooseService(info.GetSupportedVersions())
	if service == "" {
		return nil, "", fmt.Errorf("DRA driver %s serves none of the DRA services podgate speaks (%q)", name, supportedServices)
	}
	endpoint := info.GetEndpoint()
	if endpoint == "" {
		// As the kubelet reads it: the registration socket serves the DRA service too.
		endpoint = path
	}
	return &registration{
		name:     name,
		endpoint: endpoint,
		socket:   path,
		service:  service,
		versions: info.GetSupportedVersions(),
	}, "", nil
}

package dra

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containerd/errdefs"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
)

// Drivers is the set of DRA drivers registered on the node, kept current from the kubelet's
// plugin registry by [Drivers.Run]; see the package documentation. Its methods are safe for
// concurrent use.
type Drivers struct {
	dir            string
	callTimeout    time.Duration
	getInfoTimeout time.Duration
	retryInitial   time.Duration
	retryMax       time.Duration
	allowed        map[string]bool // nil: every driver
	registerer     prometheus.Registerer
	metrics        *metrics
	// trace, when set (by tests), is told of events on registry paths: "skipped" (hidden or
	// not a socket), "getinfo_failed", "ignored" (not a DRA driver, or not one of
	// WithDriverNames), "invalid", "registered", "unchanged", "forgotten". It must not block.
	trace func(event, path string)

	running     atomic.Bool
	synced      chan struct{}
	closeSynced func()
	workers     sync.WaitGroup

	mu      sync.Mutex
	seq     uint64
	sockets map[string]*regSocket  // by registration socket path
	conns   map[string]*sharedConn // by DRA endpoint
	drivers map[string]*Driver     // by driver name: the registration in use
	changed chan struct{}          // closed and replaced when drivers changes
	closed  bool
}

// regSocket is a registration socket being watched, and what it registered.
type regSocket struct {
	path   string
	cancel context.CancelFunc
	kick   chan struct{} // capacity 1: ask again now
	driver *Driver       // nil: nothing registered from this socket
	seq    uint64        // order of registration, for the newest-wins rule
}

// sharedConn is the gRPC connection to one DRA endpoint, shared by the registrations on it.
type sharedConn struct {
	conn *grpc.ClientConn
	refs int
}

// registration is a usable GetInfo answer of a DRA driver.
type registration struct {
	name, endpoint, socket, service string
	versions                        []string
}

// NewDrivers returns an empty set of drivers; [Drivers.Run] fills it.
func NewDrivers(opts ...Option) *Drivers {
	d := &Drivers{
		dir:            DefaultPluginRegistryDir,
		callTimeout:    DefaultCallTimeout,
		getInfoTimeout: DefaultGetInfoTimeout,
		retryInitial:   defaultRetryInitial,
		retryMax:       defaultRetryMax,
		synced:         make(chan struct{}),
		sockets:        map[string]*regSocket{},
		conns:          map[string]*sharedConn{},
		drivers:        map[string]*Driver{},
		changed:        make(chan struct{}),
	}
	d.closeSynced = sync.OnceFunc(func() { close(d.synced) })
	for _, o := range opts {
		o(d)
	}
	d.retryMax = max(d.retryMax, d.retryInitial)
	d.metrics = newMetrics(d.registerer)
	return d
}

// Get returns the driver registered under name.
func (d *Drivers) Get(name string) (*Driver, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	drv, ok := d.drivers[name]
	return drv, ok
}

// Lookup returns the driver registered under name, or an [*Error] of class
// errdefs.ErrUnavailable saying it is not.
func (d *Drivers) Lookup(name string) (*Driver, error) {
	if drv, ok := d.Get(name); ok {
		return drv, nil
	}
	return nil, &Error{
		Driver: name,
		msg:    fmt.Sprintf("DRA driver %s is not registered on this node", name),
		class:  errdefs.ErrUnavailable,
	}
}

// Names returns the names of the registered drivers, sorted.
func (d *Drivers) Names() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Sorted(maps.Keys(d.drivers))
}

// Changed returns a channel that is closed at the next change of the set: a driver found,
// gone, or registered anew. Take the channel before looking at the set, then wait on it.
func (d *Drivers) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// WaitFor returns the driver registered under name, waiting until it is or ctx ends.
func (d *Drivers) WaitFor(ctx context.Context, name string) (*Driver, error) {
	for {
		d.mu.Lock()
		drv, ok := d.drivers[name]
		changed := d.changed
		d.mu.Unlock()
		if ok {
			return drv, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("wait for DRA driver %s: %w", name, context.Cause(ctx))
		}
	}
}

// Synced returns a channel that is closed once every registration socket found by the first
// scan of [Drivers.Run] has been asked once, or Run has ended: from then on the set holds every
// driver that was already serving when podgate started.
func (d *Drivers) Synced() <-chan struct{} { return d.synced }

// Close forgets every driver and closes their connections. Call it after Run has returned;
// until Close, the drivers known when Run returned stay usable, so that calls made while
// podgate shuts down still reach them.
func (d *Drivers) Close() error {
	d.mu.Lock()
	d.closed = true
	conns := make([]*grpc.ClientConn, 0, len(d.conns))
	for _, c := range d.conns {
		conns = append(conns, c.conn)
	}
	for _, s := range d.sockets {
		s.cancel()
		s.driver = nil
	}
	d.sockets, d.conns = map[string]*regSocket{}, map[string]*sharedConn{}
	d.syncLocked(logr.Discard()) // shutting down: no line per driver
	d.mu.Unlock()
	return closeConns(conns)
}

// register makes reg (nil: nothing) what socket s registers, if s is still watched.
func (d *Drivers) register(logger klog.Logger, s *regSocket, reg *registration) (unchanged bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sockets[s.path] != s || d.closed {
		return true, nil
	}
	if reg != nil && s.driver != nil && s.driver.sameAs(reg) {
		return true, nil
	}
	if reg == nil && s.driver == nil {
		return true, nil
	}
	var drv *Driver
	if reg != nil {
		// Before the old endpoint is released, so that a registration on the same endpoint
		// keeps its connection.
		conn, err := d.acquireLocked(reg.endpoint)
		if err != nil {
			return false, err
		}
		drv = newDriver(reg, conn, d.callTimeout, d.metrics)
	}
	if s.driver != nil {
		d.releaseLocked(logger, s.driver.endpoint)
	}
	d.seq++
	s.driver, s.seq = drv, d.seq
	d.syncLocked(logger)
	return false, nil
}

// forget stops watching the sockets at path or below it and drops what they registered.
func (d *Drivers) forget(logger klog.Logger, path string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var gone []string
	for p, s := range d.sockets {
		if !under(p, path) {
			continue
		}
		s.cancel()
		delete(d.sockets, p)
		if s.driver != nil {
			d.releaseLocked(logger, s.driver.endpoint)
			s.driver = nil
		}
		gone = append(gone, p)
	}
	d.syncLocked(logger)
	return gone
}

// endpointBackoff paces reconnections to a DRA endpoint whose driver went away while its
// registration stayed. Calls fail at once while the connection is down (as the kubelet's do), so
// the wait is kept short: gRPC's default grows to two minutes.
var endpointBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second}

// acquireLocked returns the connection to endpoint, creating it on first use. gRPC connects on
// the first call and reconnects by itself when the driver restarts on the same endpoint.
func (d *Drivers) acquireLocked(endpoint string) (*grpc.ClientConn, error) {
	if c, ok := d.conns[endpoint]; ok {
		c.refs++
		return c.conn, nil
	}
	conn, err := grpc.NewClient("unix:"+endpoint,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: endpointBackoff, MinConnectTimeout: 5 * time.Second}))
	if err != nil {
		return nil, fmt.Errorf("DRA endpoint %s: %w", endpoint, err)
	}
	d.conns[endpoint] = &sharedConn{conn: conn, refs: 1}
	return conn, nil
}

// releaseLocked drops a reference to endpoint's connection and closes it when it was the last.
// It closes under the lock, so that once a change of the set is visible, the calls of the
// Drivers it dropped fail; nothing of podgate's runs inside gRPC's Close.
func (d *Drivers) releaseLocked(logger klog.Logger, endpoint string) {
	c, ok := d.conns[endpoint]
	if !ok {
		return
	}
	if c.refs--; c.refs > 0 {
		return
	}
	delete(d.conns, endpoint)
	if err := c.conn.Close(); err != nil {
		logger.Error(err, "Closing the connection to a DRA endpoint", "endpoint", endpoint)
	}
}

// syncLocked recomputes which registration serves each driver (the newest), logs and counts
// drivers found, updated and gone, and wakes waiters if anything changed.
func (d *Drivers) syncLocked(logger klog.Logger) {
	next := map[string]*regSocket{}
	for _, s := range d.sockets {
		if s.driver == nil {
			continue
		}
		if cur, ok := next[s.driver.name]; !ok || s.seq > cur.seq {
			next[s.driver.name] = s
		}
	}
	changed := false
	for name, s := range next {
		drv := s.driver
		old, ok := d.drivers[name]
		switch {
		case !ok:
			logger.Info("DRA driver found", "driver", name, "endpoint", drv.endpoint, "service", drv.service,
				"versions", drv.versions, "socket", drv.socket)
			d.metrics.drivers.WithLabelValues(name).Set(1)
		case old != drv:
			logger.Info("DRA driver registered anew", "driver", name, "endpoint", drv.endpoint, "service", drv.service,
				"versions", drv.versions, "socket", drv.socket)
		default:
			continue
		}
		d.drivers[name] = drv
		changed = true
	}
	for name, old := range d.drivers {
		if _, ok := next[name]; ok {
			continue
		}
		logger.Info("DRA driver gone", "driver", name, "endpoint", old.endpoint, "socket", old.socket)
		d.metrics.drivers.DeleteLabelValues(name)
		delete(d.drivers, name)
		changed = true
	}
	if changed {
		close(d.changed)
		d.changed = make(chan struct{})
	}
}

func (d *Drivers) event(event, path string) {
	if d.trace != nil {
		d.trace(event, path)
	}
}

func closeConns(conns []*grpc.ClientConn) error {
	var first error
	for _, c := range conns {
		if err := c.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

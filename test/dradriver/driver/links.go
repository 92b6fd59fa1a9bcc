package driver

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// links creates and deletes the veth pairs that stand for the driver's devices, in one network
// namespace. A netlink handle opened in that namespace does the work, so the driver never
// switches the namespace of its own threads.
type links struct {
	handle *netlink.Handle
}

// openLinks opens a netlink handle in the network namespace at nsPath, or in the caller's own
// namespace when nsPath is empty.
func openLinks(nsPath string) (*links, error) {
	if nsPath == "" {
		h, err := netlink.NewHandle()
		if err != nil {
			return nil, fmt.Errorf("netlink handle: %w", err)
		}
		return &links{handle: h}, nil
	}
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
	}
	// The handle's sockets keep the namespace alive; the file descriptor is no longer needed.
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, fmt.Errorf("netlink handle in %s: %w", nsPath, err)
	}
	return &links{handle: h}, nil
}

// close releases the netlink handle.
func (l *links) close() { l.handle.Close() }

// ensure makes the device's veth pair exist and be up. It reports whether it created the pair;
// an existing pair is success, because the kubelet (and podgate before it) prepare the same claim
// more than once.
func (l *links) ensure(dev Device) (created bool, err error) {
	link, err := l.lookup(dev.Interface)
	if err != nil {
		return false, err
	}
	if link != nil {
		if err := l.handle.LinkSetUp(link); err != nil {
			return false, fmt.Errorf("set %s up: %w", dev.Interface, err)
		}
		return false, nil
	}
	peer, err := l.lookup(dev.Peer)
	if err != nil {
		return false, err
	}
	if peer != nil {
		// Only the device end is gone: it was moved into a pod's namespace (attached), which
		// is a prepared device in use, not one to create again.
		return false, nil
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev.Interface}, PeerName: dev.Peer}
	if err := l.handle.LinkAdd(veth); err != nil {
		return false, fmt.Errorf("create veth pair %s/%s: %w", dev.Interface, dev.Peer, err)
	}
	for _, name := range []string{dev.Interface, dev.Peer} {
		if err := l.handle.LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: name}}); err != nil {
			return true, fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return true, nil
}

// remove deletes the device's veth pair. Deleting either end deletes both; the peer is tried as
// well because the device end may have been moved into a pod's namespace. Not found is success.
func (l *links) remove(dev Device) error {
	for _, name := range []string{dev.Interface, dev.Peer} {
		link, err := l.lookup(name)
		if err != nil {
			return err
		}
		if link == nil {
			continue
		}
		if err := l.handle.LinkDel(link); err != nil {
			return fmt.Errorf("delete %s: %w", name, err)
		}
	}
	return nil
}

// lookup returns the link called name, or nil if there is none.
func (l *links) lookup(name string) (netlink.Link, error) {
	link, err := l.handle.LinkByName(name)
	var notFound netlink.LinkNotFoundError
	if errors.As(err, &notFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", name, err)
	}
	return link, nil
}

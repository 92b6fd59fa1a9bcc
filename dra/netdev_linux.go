package dra

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// Attach moves the host network interface hostIf into the pod's network namespace at
// netnsPath, with the name (renamed as it moves, so that a host name the pod already uses does
// not clash), MTU and addresses of cfg, and sets it up. It returns what [Detach] needs to give
// the interface back.
//
// Attach is idempotent: an interface that an earlier Attach moved into the pod is found by the
// mark podgate leaves in its alias while it is away ("podgate:" and JSON of its host name, MTU,
// state and, when it fits, alias) and configured again as cfg says; that holds also after a
// crash between the steps. An interface is never left half-done: when a step fails, Attach gives the
// interface back as Detach does. Attach never moves a thread into another namespace for longer
// than the creation of a netlink socket, which the netlink library does on a locked thread.
//
// Errors: an invalid cfg is errdefs.ErrInvalidArgument; hostIf neither on the host nor in the
// pod, or a netnsPath that is no network namespace, errdefs.ErrFailedPrecondition; a pod
// interface that already has cfg's name, errdefs.ErrAlreadyExists. The kernel's refusals are
// not classified further.
func Attach(ctx context.Context, hostIf string, netnsPath string, cfg InterfaceConfig) (Attached, error) {
	return linkMover{}.attach(ctx, hostIf, netnsPath, cfg)
}

// Detach gives back an interface that [Attach] moved into the pod's network namespace at
// netnsPath: it flushes its addresses and sets it down in the pod, moves it to podgate's
// network namespace under its host name, and restores its MTU, alias and state there.
//
// An interface that is not in the pod, or a pod namespace that is gone, is success: the
// kernel destroys a virtual interface with its namespace and returns a physical one to the
// host, where Detach finds it by its mark and restores it; an interface given back before is
// left as it is.
func Detach(ctx context.Context, a Attached, netnsPath string) error {
	return linkMover{}.detach(ctx, a, netnsPath)
}

// Resume finishes an Attach of hostIf into the pod's network namespace at netnsPath that a
// crash interrupted after the move, before podgate recorded what Attach returned: it finds the
// interface in the pod by podgate's mark and configures it as cfg says, as Attach does when it
// finds it there. found is false, and nothing is done, when the pod's namespace is gone or
// holds no interface marked as hostIf's: Resume never moves an interface from the host. When
// configuring fails, Resume gives the interface back as Detach does.
func Resume(ctx context.Context, hostIf, netnsPath string, cfg InterfaceConfig) (_ Attached, found bool, _ error) {
	return linkMover{}.resume(ctx, hostIf, netnsPath, cfg)
}

// Reclaim gives back what an Attach of hostIf into the pod's network namespace at netnsPath
// left, when podgate has no record of what Attach returned (a crash came before its
// checkpoint): the interface marked as hostIf's, in the pod or on the host (an Attach that
// stopped after marking it, or a physical interface the kernel returned with its namespace),
// is moved to the host under its host name and restored from its mark. Not finding it is
// success. The host alias comes back only when it fitted in the mark.
func Reclaim(ctx context.Context, hostIf, netnsPath string) error {
	return linkMover{}.reclaim(ctx, hostIf, netnsPath)
}

// linkMover moves links between the host's network namespace and pods'.
type linkMover struct {
	// hostNetns is the path of the host's namespace; "" is podgate's own. Tests use a
	// namespace of their own.
	hostNetns string
}

func (m linkMover) attach(ctx context.Context, hostIf, netnsPath string, cfg InterfaceConfig) (Attached, error) {
	where := fmt.Sprintf("attach %s to %s", hostIf, netnsPath)
	if err := cfg.validate(); err != nil {
		return Attached{}, errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf("%s: %v", where, err))
	}
	if err := ctx.Err(); err != nil {
		return Attached{}, fmt.Errorf("%s: %w", where, err)
	}
	ns, err := m.open(netnsPath)
	if err != nil {
		return Attached{}, fmt.Errorf("%s: %w", where, err)
	}
	defer ns.close()
	if ns.pod == nil {
		return Attached{}, errdefs.ErrFailedPrecondition.WithMessage(where + ": no such network namespace")
	}
	podName := cmp.Or(cfg.Name, hostIf)
	a, err := ns.moveIn(ctx, hostIf, podName)
	if err != nil {
		return Attached{}, fmt.Errorf("%s: %w", where, err)
	}
	if a, err = ns.configure(a, cfg); err != nil {
		if undo := ns.giveBack(ctx, a); undo != nil {
			err = errors.Join(err, fmt.Errorf("give back: %w", undo))
		}
		return Attached{}, fmt.Errorf("%s: %w", where, err)
	}
	klog.FromContext(ctx).V(2).Info("Attached network interface", "hostInterface", hostIf, "netns", netnsPath,
		"interface", a.PodName, "mtu", cfg.MTU, "addresses", a.Addresses)
	return a, nil
}

func (m linkMover) detach(ctx context.Context, a Attached, netnsPath string) error {
	if a.HostName == "" || a.PodName == "" {
		return errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf("detach from %s: no interface names in %+v", netnsPath, a))
	}
	ns, err := m.open(netnsPath)
	if err != nil {
		return fmt.Errorf("detach %s from %s: %w", a.PodName, netnsPath, err)
	}
	defer ns.close()
	if ns.pod == nil {
		klog.FromContext(ctx).Info("Pod network namespace gone, looking for the interface on the host", "netns", netnsPath, "hostInterface", a.HostName)
	}
	if err := ns.giveBack(ctx, a); err != nil {
		return fmt.Errorf("detach %s from %s: %w", a.PodName, netnsPath, err)
	}
	return nil
}

func (m linkMover) resume(ctx context.Context, hostIf, netnsPath string, cfg InterfaceConfig) (Attached, bool, error) {
	where := fmt.Sprintf("resume attach of %s to %s", hostIf, netnsPath)
	if err := cfg.validate(); err != nil {
		return Attached{}, false, errdefs.ErrInvalidArgument.WithMessage(fmt.Sprintf("%s: %v", where, err))
	}
	ns, err := m.open(netnsPath)
	if err != nil {
		return Attached{}, false, fmt.Errorf("%s: %w", where, err)
	}
	defer ns.close()
	if ns.pod == nil {
		return Attached{}, false, nil
	}
	podName := cmp.Or(cfg.Name, hostIf)
	link, _, err := findMarked(ns.pod, podName, hostIf)
	if err != nil {
		return Attached{}, false, fmt.Errorf("%s: look for %s in the pod: %w", where, hostIf, err)
	}
	if link == nil {
		return Attached{}, false, nil
	}
	a, err := ns.findMovedIn(ctx, hostIf, podName)
	if err == nil {
		a, err = ns.configure(a, cfg)
		if err != nil {
			if undo := ns.giveBack(ctx, a); undo != nil {
				err = errors.Join(err, fmt.Errorf("give back: %w", undo))
			}
		}
	}
	if err != nil {
		return Attached{}, true, fmt.Errorf("%s: %w", where, err)
	}
	klog.FromContext(ctx).V(2).Info("Resumed attach of network interface", "hostInterface", hostIf, "netns", netnsPath,
		"interface", a.PodName, "mtu", cfg.MTU, "addresses", a.Addresses)
	return a, true, nil
}

func (m linkMover) reclaim(ctx context.Context, hostIf, netnsPath string) error {
	where := fmt.Sprintf("reclaim %s from %s", hostIf, netnsPath)
	ns, err := m.open(netnsPath)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	defer ns.close()
	a := Attached{HostName: hostIf, PodName: hostIf}
	if ns.pod != nil {
		link, mark, err := findMarked(ns.pod, hostIf, hostIf)
		if err != nil {
			return fmt.Errorf("%s: look for it in the pod: %w", where, err)
		}
		if link != nil {
			a = attachedFromMark(mark)
			a.PodName = link.Attrs().Name
			if err := ns.moveOut(link, hostIf); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
	}
	// On the host now, or left there marked: the mark says how to restore it.
	_, mark, err := findMarked(ns.host, hostIf, hostIf)
	if err != nil {
		return fmt.Errorf("%s: look for it on the host: %w", where, err)
	}
	if mark.Name != "" {
		podName := a.PodName
		a = attachedFromMark(mark)
		a.PodName = podName
	}
	if err := ns.restore(ctx, a); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// namespaces holds the host's and a pod's network namespaces and netlink handles bound to
// them: a handle's socket lives in its namespace, so requests through it need no setns.
type namespaces struct {
	hostNS, podNS netns.NsHandle
	host, pod     *netlink.Handle // pod is nil when the pod's namespace is gone
}

// open opens the host's namespace and the pod's at podPath. A pod namespace that does not
// exist (any more) leaves pod nil.
func (m linkMover) open(podPath string) (_ *namespaces, err error) {
	ns := &namespaces{hostNS: netns.None(), podNS: netns.None()}
	defer func() {
		if err != nil {
			ns.close()
		}
	}()
	if ns.hostNS, err = m.hostNamespace(); err != nil {
		return nil, fmt.Errorf("open the host's network namespace: %w", err)
	}
	if ns.host, err = netlink.NewHandleAt(ns.hostNS, unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("netlink in the host's network namespace: %w", err)
	}
	if ns.podNS, err = openNetns(podPath); err != nil || !ns.podNS.IsOpen() {
		return ns, err
	}
	if ns.podNS.Equal(ns.hostNS) {
		return nil, errdefs.ErrInvalidArgument.WithMessage(podPath + " is the host's network namespace, not a pod's")
	}
	if ns.pod, err = netlink.NewHandleAt(ns.podNS, unix.NETLINK_ROUTE); err != nil {
		return nil, fmt.Errorf("netlink in the pod's network namespace: %w", err)
	}
	return ns, nil
}

// hostNamespace opens the host's namespace: podgate's own is that of its threads, which
// podgate moves into other namespaces only while locked.
func (m linkMover) hostNamespace() (netns.NsHandle, error) {
	if m.hostNetns != "" {
		return netns.GetFromPath(m.hostNetns)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return netns.Get()
}

// openNetns opens the network namespace at path; netns.None() when there is none: no file, or
// the file left behind once the runtime unmounted the namespace.
func openNetns(path string) (netns.NsHandle, error) {
	h, err := netns.GetFromPath(path)
	if errors.Is(err, os.ErrNotExist) {
		return netns.None(), nil
	}
	if err != nil {
		return netns.None(), fmt.Errorf("open network namespace %s: %w", path, err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(h), &st); err != nil || st.Type != unix.NSFS_MAGIC {
		h.Close()
		return netns.None(), nil
	}
	return h, nil
}

func (ns *namespaces) close() {
	for _, h := range []*netlink.Handle{ns.host, ns.pod} {
		if h != nil {
			h.Close()
		}
	}
	for _, n := range []*netns.NsHandle{&ns.hostNS, &ns.podNS} {
		if n.IsOpen() {
			n.Close()
		}
	}
}

// moveIn moves hostIf into the pod as podName, marked, and returns what to give back. An
// interface already in the pod, marked as hostIf's, stays and is renamed if needed.
func (ns *namespaces) moveIn(ctx context.Context, hostIf, podName string) (Attached, error) {
	link, err := ns.host.LinkByName(hostIf)
	if isLinkNotFound(err) {
		return ns.findMovedIn(ctx, hostIf, podName)
	}
	if err != nil {
		return Attached{}, fmt.Errorf("find %s on the host: %w", hostIf, err)
	}
	a := attachedFrom(link)
	a.PodName = podName
	if other, err := ns.pod.LinkByName(podName); err == nil {
		if o, ok := parseLinkMark(other.Attrs().Alias); !ok || o.Name != hostIf {
			return Attached{}, errdefs.ErrAlreadyExists.WithMessage(fmt.Sprintf("the pod already has an interface %s", podName))
		}
	}
	if err := ns.host.LinkSetAlias(link, markOf(a).alias()); err != nil {
		return Attached{}, fmt.Errorf("mark %s: %w", hostIf, err)
	}
	if err := moveLink(ns.hostNS, link.Attrs().Index, ns.podNS, podName); err != nil {
		return a, ns.undoMoveIn(ctx, a, fmt.Errorf("move %s into the pod as %s: %w", hostIf, podName, err))
	}
	return a, nil
}

// undoMoveIn gives back an interface whose move into the pod failed: the kernel may have moved
// it without the new name.
func (ns *namespaces) undoMoveIn(ctx context.Context, a Attached, err error) error {
	if undo := ns.giveBack(ctx, a); undo != nil {
		return errors.Join(err, fmt.Errorf("give back: %w", undo))
	}
	return err
}

// findMovedIn finds hostIf in the pod after an earlier Attach, and names it podName.
func (ns *namespaces) findMovedIn(ctx context.Context, hostIf, podName string) (Attached, error) {
	link, mark, err := findMarked(ns.pod, podName, hostIf)
	if err != nil {
		return Attached{}, fmt.Errorf("look for %s in the pod: %w", hostIf, err)
	}
	if link == nil {
		return Attached{}, errdefs.ErrFailedPrecondition.WithMessage(fmt.Sprintf("host interface %s not found", hostIf))
	}
	a := attachedFromMark(mark)
	a.PodName = podName
	if link.Attrs().Name == podName {
		return a, nil
	}
	if err := ns.pod.LinkSetDown(link); err != nil {
		return a, ns.undoMoveIn(ctx, a, fmt.Errorf("set %s down: %w", link.Attrs().Name, err))
	}
	if err := ns.pod.LinkSetName(link, podName); err != nil {
		return a, ns.undoMoveIn(ctx, a, fmt.Errorf("rename %s to %s in the pod: %w", link.Attrs().Name, podName, err))
	}
	return a, nil
}

// configure sets the MTU and addresses of a's interface in the pod and sets it up.
func (ns *namespaces) configure(a Attached, cfg InterfaceConfig) (Attached, error) {
	link, err := ns.pod.LinkByName(a.PodName)
	if err != nil {
		return a, fmt.Errorf("find %s in the pod: %w", a.PodName, err)
	}
	if cfg.MTU != 0 && link.Attrs().MTU != cfg.MTU {
		if err := ns.pod.LinkSetMTU(link, cfg.MTU); err != nil {
			return a, fmt.Errorf("set MTU %d on %s: %w", cfg.MTU, a.PodName, err)
		}
	}
	for _, s := range cfg.Addresses {
		addr, err := netlink.ParseAddr(s)
		if err != nil {
			return a, fmt.Errorf("address %s: %w", s, err)
		}
		if err := ns.pod.AddrAdd(link, addr); err != nil && !errors.Is(err, unix.EEXIST) {
			return a, fmt.Errorf("add address %s to %s: %w", s, a.PodName, err)
		}
	}
	if err := ns.pod.LinkSetUp(link); err != nil {
		return a, fmt.Errorf("set %s up: %w", a.PodName, err)
	}
	a.HardwareAddr = link.Attrs().HardwareAddr.String()
	a.Addresses = cfg.Addresses
	return a, nil
}

// giveBack moves a's interface from the pod, when it is there, to the host under its host
// name, and restores it there. Not finding it anywhere is success.
func (ns *namespaces) giveBack(ctx context.Context, a Attached) error {
	if ns.pod != nil {
		link, _, err := findMarked(ns.pod, a.PodName, a.HostName)
		if err != nil {
			return fmt.Errorf("look for %s in the pod: %w", a.PodName, err)
		}
		if link != nil {
			if err := ns.moveOut(link, a.HostName); err != nil {
				return err
			}
		}
	}
	return ns.restore(ctx, a)
}

// moveOut clears link in the pod and moves it to the host as hostName.
func (ns *namespaces) moveOut(link netlink.Link, hostName string) error {
	name := link.Attrs().Name
	addrs, err := ns.pod.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses of %s: %w", name, err)
	}
	for _, addr := range addrs {
		if err := ns.pod.AddrDel(link, &addr); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
			return fmt.Errorf("delete address %s of %s: %w", addr.IPNet, name, err)
		}
	}
	if err := ns.pod.LinkSetDown(link); err != nil {
		return fmt.Errorf("set %s down: %w", name, err)
	}
	if err := moveLink(ns.podNS, link.Attrs().Index, ns.hostNS, hostName); err != nil {
		return fmt.Errorf("move %s to the host as %s: %w", name, hostName, err)
	}
	return nil
}

// restore finds a's interface on the host by its mark and gives it back its name, MTU, alias
// and state. An interface without the mark was restored before, or is gone.
func (ns *namespaces) restore(ctx context.Context, a Attached) error {
	link, _, err := findMarked(ns.host, a.HostName, a.HostName)
	if err != nil {
		return fmt.Errorf("look for %s on the host: %w", a.HostName, err)
	}
	logger := klog.FromContext(ctx)
	if link == nil {
		logger.Info("Network interface not in the pod nor marked on the host: given back before, or gone", "hostInterface", a.HostName, "interface", a.PodName)
		return nil
	}
	if name := link.Attrs().Name; name != a.HostName {
		if err := ns.host.LinkSetDown(link); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
		if err := ns.host.LinkSetName(link, a.HostName); err != nil {
			return fmt.Errorf("rename %s to %s on the host: %w", name, a.HostName, err)
		}
	}
	if a.MTU != 0 && link.Attrs().MTU != a.MTU {
		if err := ns.host.LinkSetMTU(link, a.MTU); err != nil {
			return fmt.Errorf("restore MTU %d of %s: %w", a.MTU, a.HostName, err)
		}
	}
	if a.Up {
		if err := ns.host.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", a.HostName, err)
		}
	}
	// The mark goes last: until the interface is whole again, another Detach can find it.
	if err := ns.host.LinkSetAlias(link, a.Alias); err != nil {
		return fmt.Errorf("restore alias of %s: %w", a.HostName, err)
	}
	logger.V(2).Info("Gave network interface back to the host", "hostInterface", a.HostName, "interface", a.PodName)
	return nil
}

// moveLink moves the link with index from the namespace from to the namespace to, named name
// there, in one RTM_NEWLINK request (as runc moves an OCI netDevice): the kernel takes the new
// name as it moves the link, so the link's old name may be taken in the target namespace. The
// request goes through a socket in from, where index means the link.
func moveLink(from netns.NsHandle, index int, to netns.NsHandle, name string) error {
	sock, err := nl.GetNetlinkSocketAt(from, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer sock.Close()
	req := nl.NewNetlinkRequest(unix.RTM_NEWLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: sock}}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(name)))
	req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(to))))
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

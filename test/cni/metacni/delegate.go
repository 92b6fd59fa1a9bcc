package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// delegatePlugin is the plugin that moves a host interface into the pod and back.
const delegatePlugin = "host-device"

// delegateTimeout bounds one delegate call: host-device only moves and renames a link, in
// milliseconds; a hung delegate must not hold the pod's CNI ADD for the runtime's whole budget.
const delegateTimeout = 30 * time.Second

// delegation is one delegate call: the plugin, the configuration it was given and the
// interface name (CNI_IFNAME) it was called with.
type delegation struct {
	Plugin        string          `json:"plugin"`
	HostInterface string          `json:"hostInterface"`
	IfName        string          `json:"ifName"`
	Conf          json.RawMessage `json:"conf"`
	// Skipped says why DEL did not call the delegate (nothing to give back).
	Skipped string `json:"skipped,omitempty"`
	// Error is the delegate's error.
	Error string `json:"error,omitempty"`
}

// delegateConf is host-device's configuration for one device.
type delegateConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	Device     string `json:"device"`
}

// plan lists the delegations for the pod's network devices: one per device with a host
// interface that podgate did not attach itself, named in the pod as its network data says.
// ifName is the CNI_IFNAME of this call (the chain's own interface), which no device may take.
func plan(conf *NetConf, pod *pb.Pod, ifName string) ([]delegation, error) {
	var out []delegation
	names := map[string]string{ifName: "CNI_IFNAME"}
	for _, c := range pod.GetClaims() {
		for _, d := range c.GetDevices() {
			n := d.GetNetwork()
			if n.GetHostInterface() == "" || n.GetAttached() {
				continue
			}
			name := n.GetInterfaceName()
			if name == "" {
				name = n.GetHostInterface()
			}
			dev := fmt.Sprintf("device %s/%s/%s of claim %s/%s", d.GetDriver(), d.GetPool(), d.GetDevice(), c.GetNamespace(), c.GetName())
			if other, taken := names[name]; taken {
				return nil, fmt.Errorf("%s: interface name %q in the pod is also %s's", dev, name, other)
			}
			names[name] = dev
			raw, err := json.Marshal(delegateConf{CNIVersion: conf.CNIVersion, Name: conf.Name, Type: delegatePlugin, Device: n.GetHostInterface()})
			if err != nil {
				return nil, err
			}
			out = append(out, delegation{Plugin: delegatePlugin, HostInterface: n.GetHostInterface(), IfName: name, Conf: raw})
		}
	}
	return out, nil
}

// cniArgs are the delegate's CNI arguments: this call's, with the device's interface name.
func (d delegation) cniArgs(command string, args *skel.CmdArgs) *invoke.Args {
	return &invoke.Args{
		Command: command, ContainerID: args.ContainerID, NetNS: args.Netns,
		PluginArgsStr: args.Args, IfName: d.IfName, Path: args.Path,
	}
}

// add runs the delegate's ADD. invoke.DelegateAdd would pass the plugin's own CNI_IFNAME on
// (it only overrides CNI_COMMAND), so the plugin is run with explicit arguments instead.
func (d delegation) add(ctx context.Context, args *skel.CmdArgs) (types.Result, error) {
	ctx, cancel := context.WithTimeout(ctx, delegateTimeout)
	defer cancel()
	path, err := invoke.FindInPath(d.Plugin, filepath.SplitList(args.Path))
	if err != nil {
		return nil, err
	}
	res, err := invoke.ExecPluginWithResult(ctx, path, d.Conf, d.cniArgs("ADD", args), nil)
	if err != nil {
		return nil, fmt.Errorf("%s ADD of %s as %s: %w", d.Plugin, d.HostInterface, d.IfName, err)
	}
	return res, nil
}

// del runs the delegate's DEL.
func (d delegation) del(ctx context.Context, args *skel.CmdArgs) error {
	ctx, cancel := context.WithTimeout(ctx, delegateTimeout)
	defer cancel()
	path, err := invoke.FindInPath(d.Plugin, filepath.SplitList(args.Path))
	if err != nil {
		return err
	}
	if err := invoke.ExecPluginWithoutResult(ctx, path, d.Conf, d.cniArgs("DEL", args), nil); err != nil {
		return fmt.Errorf("%s DEL of %s (%s in the pod): %w", d.Plugin, d.HostInterface, d.IfName, err)
	}
	return nil
}

// errNoNetns means the pod's network namespace is gone: the kernel already gave its physical
// interfaces back to the host and destroyed its virtual ones.
var errNoNetns = errors.New("network namespace gone")

// inPod reports whether the pod's network namespace at path holds an interface named ifName.
// host-device's DEL fails when the namespace or the interface is gone, so DEL asks first.
func inPod(path, ifName string) (bool, error) {
	if path == "" {
		return false, errNoNetns
	}
	ns, err := netns.GetFromPath(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, errNoNetns
	}
	if err != nil {
		return false, fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return false, fmt.Errorf("netlink in %s: %w", path, err)
	}
	defer h.Close()
	_, err = h.LinkByName(ifName)
	if _, notFound := errors.AsType[netlink.LinkNotFoundError](err); notFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up %s in %s: %w", ifName, path, err)
	}
	return true, nil
}

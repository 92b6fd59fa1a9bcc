package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// supported lists the CNI versions the plugin speaks: from 0.3.0, the first with prevResult, to
// 1.0.0, the newest the delegate (Debian's host-device 1.1.1) speaks.
var supported = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0")

func main() {
	// GC and STATUS are nil: skel answers them with success; DEL cleans up per container.
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck}, supported,
		"pgmetacni: podgate's test meta-CNI plugin (moves a pod's DRA network devices in with host-device)")
}

func newEntry(command string, args *skel.CmdArgs) Entry {
	return Entry{Time: time.Now(), Command: command, ContainerID: args.ContainerID, Netns: args.Netns, IfName: args.IfName}
}

// finish records e, with err if any, and returns err. A failed record fails the call: a test
// must not silently miss the observation it depends on.
func finish(conf *NetConf, e *Entry, err error) error {
	if err != nil {
		e.Errors = append(e.Errors, err.Error())
	}
	if rerr := appendEntry(conf.RecordFile, *e); rerr != nil {
		err = errors.Join(err, rerr)
	}
	if err != nil {
		return fmt.Errorf("pgmetacni: %w", err)
	}
	return nil
}

// cmdAdd asks podgate for the pod's network devices, moves each into the pod with the delegate
// and prints the previous result with the delegates' interfaces added.
func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return fmt.Errorf("pgmetacni: %w", err)
	}
	e := newEntry("ADD", args)
	result, err := add(context.Background(), conf, args, &e)
	if err := finish(conf, &e, err); err != nil {
		return err
	}
	return types.PrintResult(result, conf.CNIVersion)
}

func add(ctx context.Context, conf *NetConf, args *skel.CmdArgs, e *Entry) (*current.Result, error) {
	pod, err := parseArgs(args.Args)
	if err != nil {
		return nil, err
	}
	e.Pod = pod
	result, err := startResult(conf.PrevResult)
	if err != nil {
		return nil, err
	}
	if !pod.known() {
		return result, nil // no pod, so no pod's devices
	}
	pr, err := dialPodResources(conf.PodResourcesSocket)
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	// Fail closed: a pod whose devices podgate cannot tell must not start without them. Only
	// a pod podgate does not know (NotFound) has none.
	p, found, err := pr.extensionGet(ctx, pod)
	if err != nil {
		return nil, err
	}
	e.Extension = describeExtension(p, found)
	// The v1 answer, as multus would read it: not needed to delegate, recorded to show what a
	// client of the kubelet's API sees of the same pod.
	v, v1Found, err := pr.v1Get(ctx, pod)
	if err != nil {
		return nil, err
	}
	e.V1 = describeV1(v, v1Found)
	if !found {
		return result, nil
	}
	ds, err := plan(conf, p, args.IfName)
	if err != nil || len(ds) == 0 {
		return result, err
	}
	// Written before the first move: the runtime's DEL after a failed or interrupted ADD
	// then gives back whatever did move.
	if err := writeCache(conf.CacheDir, cacheEntry{ContainerID: args.ContainerID, Netns: args.Netns, Pod: pod, Delegations: ds}); err != nil {
		return nil, err
	}
	for i := range ds {
		e.Delegated = ds[:i+1]
		res, err := ds[i].add(ctx, args)
		if err != nil {
			ds[i].Error = err.Error()
			return nil, err
		}
		if err := merge(result, res); err != nil {
			return nil, err
		}
	}
	return result, nil
}

// cmdDel gives back what ADD moved into the pod, from the container's cache entry: podgate may
// no longer know the pod. No entry means nothing to give back (or given back already).
func cmdDel(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return fmt.Errorf("pgmetacni: %w", err)
	}
	e := newEntry("DEL", args)
	if pod, err := parseArgs(args.Args); err == nil {
		e.Pod = pod // only for the record: DEL works from the cache
	}
	return finish(conf, &e, del(context.Background(), conf, args, &e))
}

func del(ctx context.Context, conf *NetConf, args *skel.CmdArgs, e *Entry) error {
	c, ok, err := readCache(conf.CacheDir, args.ContainerID)
	if err != nil || !ok {
		return err
	}
	var errs []error
	for i := range c.Delegations {
		d := &c.Delegations[i]
		present, err := inPod(args.Netns, d.IfName)
		switch {
		case errors.Is(err, errNoNetns):
			d.Skipped = "the pod's network namespace is gone"
		case err != nil:
			d.Error = err.Error()
			errs = append(errs, err)
		case !present:
			d.Skipped = d.IfName + " is not in the pod"
		default:
			if err := d.del(ctx, args); err != nil {
				d.Error = err.Error()
				errs = append(errs, err)
			}
		}
	}
	e.Delegated = c.Delegations
	if len(errs) > 0 {
		return errors.Join(errs...) // the entry stays, for the runtime's retry
	}
	return removeCache(conf.CacheDir, args.ContainerID)
}

// cmdCheck validates the configuration.
func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConf(args.StdinData)
	if err != nil {
		return fmt.Errorf("pgmetacni: %w", err)
	}
	e := newEntry("CHECK", args)
	return finish(conf, &e, nil)
}

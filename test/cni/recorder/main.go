package main

import (
	"fmt"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podgate/podgate/test/cni/record"
)

// supported lists the CNI versions the recorder speaks: from 0.3.0, the first with prevResult.
var supported = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	// GC and STATUS are nil: skel answers them with success, and there is nothing to collect.
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck}, supported,
		"pgrecorder: podgate's CNI recorder (records host interfaces and files at CNI ADD/DEL)")
}

// cmdAdd records the call, then prints the previous result unchanged.
func cmdAdd(args *skel.CmdArgs) error {
	conf, err := load(args)
	if err != nil {
		return err
	}
	if err := write(conf, "ADD", args); err != nil {
		return err
	}
	// As an SR-IOV CNI plugin does: multus shows this file in the pod's network-status.
	if f := conf.RuntimeConfig.CNIDeviceInfoFile; f != "" && conf.DeviceID != "" {
		if err := record.WriteDeviceInfo(f, conf.DeviceID); err != nil {
			return fmt.Errorf("pgrecorder: %w", err)
		}
	}
	var result types.Result = &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if conf.PrevResult != nil {
		result = conf.PrevResult
	}
	return types.PrintResult(result, conf.CNIVersion)
}

// cmdDel records the call; DEL has no output.
func cmdDel(args *skel.CmdArgs) error {
	conf, err := load(args)
	if err != nil {
		return err
	}
	return write(conf, "DEL", args)
}

// cmdCheck only validates the configuration: the recorder sets nothing up that could be wrong.
func cmdCheck(args *skel.CmdArgs) error {
	_, err := load(args)
	return err
}

func load(args *skel.CmdArgs) (*record.NetConf, error) {
	conf, err := record.ParseConf(args.StdinData)
	if err != nil {
		return nil, err
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, err
	}
	return conf, nil
}

// write appends the entry of this call. A failure fails the call: a test must not silently miss
// the observation it depends on.
func write(conf *record.NetConf, command string, args *skel.CmdArgs) error {
	now := time.Now()
	ifaces, err := record.HostInterfaces(conf.WatchInterfaces, conf.WatchPrefixes)
	if err != nil {
		return err
	}
	files, err := record.HostFiles(conf.WatchFiles)
	if err != nil {
		return err
	}
	e := record.Entry{
		Time:        now,
		Command:     command,
		ContainerID: args.ContainerID,
		Netns:       args.Netns,
		IfName:      args.IfName,
		Pod:         record.ParseArgs(args.Args),
		Interfaces:  ifaces,
		Files:       files,
		DeviceID:    conf.DeviceID,
	}
	if err := record.Append(conf.RecordFile, e); err != nil {
		return fmt.Errorf("pgrecorder: %w", err)
	}
	return nil
}

package main

import (
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// startResult is the result the plugin adds to: the previous plugin's, converted to the
// current version, or an empty one when the plugin runs first in its chain.
func startResult(prev types.Result) (*current.Result, error) {
	if prev == nil {
		return &current.Result{CNIVersion: current.ImplementedSpecVersion}, nil
	}
	r, err := current.NewResultFromResult(prev)
	if err != nil {
		return nil, fmt.Errorf("prevResult: %w", err)
	}
	return r, nil
}

// merge appends a delegate's interfaces, IPs and routes to r. The delegate's IPs point at its
// own interfaces by index, so they are shifted by the number of interfaces r held before. DNS
// stays r's: the pod's resolver is the main network's.
func merge(r *current.Result, delegate types.Result) error {
	d, err := current.NewResultFromResult(delegate)
	if err != nil {
		return fmt.Errorf("delegate result: %w", err)
	}
	offset := len(r.Interfaces)
	for _, i := range d.Interfaces {
		r.Interfaces = append(r.Interfaces, i.Copy())
	}
	for _, ip := range d.IPs {
		ip = ip.Copy()
		if ip.Interface != nil {
			if *ip.Interface < 0 || *ip.Interface >= len(d.Interfaces) {
				return fmt.Errorf("delegate result: IP %s names interface %d of %d", ip.Address.String(), *ip.Interface, len(d.Interfaces))
			}
			ip.Interface = current.Int(*ip.Interface + offset)
		}
		r.IPs = append(r.IPs, ip)
	}
	for _, rt := range d.Routes {
		r.Routes = append(r.Routes, rt.Copy())
	}
	return nil
}

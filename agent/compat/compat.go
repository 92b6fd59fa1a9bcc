package compat

import (
	"fmt"

	"k8s.io/apimachinery/pkg/util/version"
)

// Range is the minor releases of one component podgate is tested with, both ends included.
type Range struct {
	// Component names it as the logs and the metric do: "kubelet" or "containerd".
	Component string
	// Min and Max are minor releases, "1.35".
	Min, Max string
}

// The tested ranges. They match test/matrix/versions.env (checked by test/matrix's tests).
var (
	Kubelet    = Range{Component: "kubelet", Min: "1.35", Max: "1.37"}
	Containerd = Range{Component: "containerd", Min: "2.3", Max: "2.4"}
)

// String is the range as the logs show it.
func (r Range) String() string { return r.Component + " " + r.Min + "–" + r.Max }

// Verdict is where one version stands against a tested range.
type Verdict struct {
	// Version is the version seen, as the component reported it.
	Version string
	// Tested: the version's minor release is in the range.
	Tested bool
	// Why says why it is not, for the warning; empty when Tested.
	Why string
}

// Check says where v (a semantic version as the component reports it: "v1.37.2",
// "1.36.3-gke.1", "v2.4.2") stands against r.
func (r Range) Check(v string) Verdict {
	parsed, err := version.ParseGeneric(v)
	if err != nil {
		return Verdict{Version: v, Why: fmt.Sprintf("version %q not understood: %v", v, err)}
	}
	minor := version.MajorMinor(parsed.Major(), parsed.Minor())
	lo, hi := version.MustParseGeneric(r.Min), version.MustParseGeneric(r.Max)
	switch {
	case minor.LessThan(lo):
		return Verdict{Version: v, Why: fmt.Sprintf("older than the tested %s", r)}
	case hi.LessThan(minor):
		return Verdict{Version: v, Why: fmt.Sprintf("newer than the tested %s", r)}
	}
	return Verdict{Version: v, Tested: true}
}

// Runtime says where a CRI runtime stands, from its Version answer (runtime_name,
// runtime_version): only containerd is tested.
func Runtime(name, v string) Verdict {
	if name != Containerd.Component {
		return Verdict{Version: v, Why: fmt.Sprintf("runtime %q is not tested (podgate is tested with %s)", name, Containerd)}
	}
	return Containerd.Check(v)
}

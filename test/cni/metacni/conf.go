package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// NetConf is the plugin's network configuration, one plugin entry of a conflist:
//
//	{"type": "pgmetacni", "podResourcesSocket": "/var/lib/kubelet/pod-resources/podgate.sock",
//	 "recordFile": "/tmp/x/metacni.jsonl", "cacheDir": "/tmp/x/metacni-cache"}
type NetConf struct {
	types.PluginConf
	// PodResourcesSocket is podgate's PodResources socket. Required.
	PodResourcesSocket string `json:"podResourcesSocket"`
	// RecordFile is the JSON-lines file each call appends an Entry to. Required.
	RecordFile string `json:"recordFile"`
	// CacheDir holds one file per container ID naming what ADD delegated, for DEL. Required.
	CacheDir string `json:"cacheDir"`
}

// parseConf decodes and checks the network configuration CNI passes on stdin, previous result
// included.
func parseConf(data []byte) (*NetConf, error) {
	var conf NetConf
	if err := json.Unmarshal(data, &conf); err != nil {
		return nil, fmt.Errorf("decode network configuration: %w", err)
	}
	var errs []error
	for _, f := range []struct{ name, value string }{
		{"podResourcesSocket", conf.PodResourcesSocket},
		{"recordFile", conf.RecordFile},
		{"cacheDir", conf.CacheDir},
	} {
		switch {
		case f.value == "":
			errs = append(errs, fmt.Errorf("%s is required", f.name))
		case !filepath.IsAbs(f.value):
			errs = append(errs, fmt.Errorf("%s: %q: want an absolute path", f.name, f.value))
		}
	}
	if conf.CNIVersion == "" {
		errs = append(errs, errors.New("cniVersion is required"))
	}
	if conf.Name == "" {
		// The delegate's configuration carries the network's name.
		errs = append(errs, errors.New("name is required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("network configuration: %w", err)
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, fmt.Errorf("network configuration: prevResult: %w", err)
	}
	return &conf, nil
}

// k8sArgs are the CNI_ARGS keys the kubelet's runtime sets for a pod, as multus reads them.
// The field names are the keys: types.LoadArgs matches them by name.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
}

// podRef is the pod a CNI call is for.
type podRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// known reports whether the call names a pod at all: a runtime that is not the kubelet's may
// call the plugin for a container that is no pod.
func (p podRef) known() bool { return p.Namespace != "" && p.Name != "" }

// parseArgs reads the pod from CNI_ARGS ("K=V;K=V"). A key it does not know is an error unless
// the arguments hold IgnoreUnknown=1, as containerd's do (types.LoadArgs's rule).
func parseArgs(cniArgs string) (podRef, error) {
	var a k8sArgs
	if err := types.LoadArgs(cniArgs, &a); err != nil {
		return podRef{}, fmt.Errorf("CNI_ARGS: %w", err)
	}
	return podRef{Namespace: string(a.K8S_POD_NAMESPACE), Name: string(a.K8S_POD_NAME), UID: string(a.K8S_POD_UID)}, nil
}

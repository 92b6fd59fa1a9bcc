// Command recorder is a chained CNI plugin for podgate's end-to-end tests that records what CNI
// saw: on ADD (and DEL) it appends one JSON line (record.Entry, package test/cni/record) to the
// file named by "recordFile" in its configuration, with the time, CNI_CONTAINERID, CNI_NETNS,
// CNI_IFNAME, the pod from CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_UID) and, for each
// host interface named in "watchInterfaces" or starting with one of "watchPrefixes", whether it
// existed in the plugin's network namespace (the host's, where containerd runs CNI) at that
// moment, the host files matching the glob patterns of "watchFiles" that existed then (a DRA
// driver's CDI spec files, named after claim UIDs no configuration can know), and the "deviceID"
// a meta plugin such as multus put in its configuration; with a deviceID and the runtimeConfig
// capability "CNIDeviceInfoFile", ADD writes that file's device information (type pci, the
// device ID as address) as an SR-IOV CNI plugin does. It then passes the previous plugin's
// result (prevResult) through unchanged, so the chain works as before; as the first plugin of a
// chain it returns an empty result. CHECK, GC and STATUS succeed without doing anything. It
// supports CNI versions 0.3.0 to 1.1.0.
//
// What the e2e test uses it for: the DRA end-to-end test creates a ResourceClaim allocated to a
// device of test/dradriver (host interface pgnic0) for a pod. podgate must prepare the claim
// before containerd runs CNI ADD for the pod's sandbox; the recorder's ADD entry for the pod says
// whether pgnic0 existed at that moment ("interfaces": {"pgnic0": true}).
//
// The same for a driver nobody here wrote: dra-example-driver writes one CDI spec file per
// prepared claim under its --cdi-root; with "watchFiles": ["<cdi root>/*"] the pod's ADD entry
// lists that file when the claim was prepared before CNI ("files": [...]).
//
// Install it under the name its configuration's "type" uses, in a directory of containerd's CNI
// bin_dirs:
//
//	go build -o <bin dir>/pgrecorder ./test/cni/recorder
//
// and add it to the conflist after the plugins whose result it passes on, e.g. after bridge:
//
//	"plugins": [
//	  {"type": "bridge", ...},
//	  {"type": "pgrecorder", "recordFile": "/tmp/pgr-x/cni-record.jsonl",
//	   "watchInterfaces": ["pgnic0", "pgnic1"], "watchPrefixes": ["pgnic"],
//	   "watchFiles": ["/tmp/pgr-x/cdi/*"]}
//	]
package main

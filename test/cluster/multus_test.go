//go:build linux

package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	v1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/cluster"
	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/dranode"
	"github.com/podgate/podgate/test/harness"
	"github.com/podgate/podgate/test/rig"
	"github.com/podgate/podgate/test/testfs"
)

// What multus v4.3.0 reads and writes on a pod (the Network Plumbing Working Group's
// specification), and the annotation that makes it read PodResources.
const (
	networksAnnotation      = "k8s.v1.cni.cncf.io/networks"
	networkStatusAnnotation = "k8s.v1.cni.cncf.io/network-status"
	resourceNameAnnotation  = "k8s.v1.cni.cncf.io/resourceName"
)

// multusBurst is the number of pods of a burst: a node's worth starting at once, each CNI ADD
// asking PodResources (multus-cni#1545: the kubelet refuses over its limit, and the pod's
// sandbox is retried).
const multusBurst = 20

// nadGVR is the NetworkAttachmentDefinition's resource; crdGVR the CRD's.
var (
	nadGVR = schema.GroupVersionResource{Group: "k8s.cni.cncf.io", Version: "v1", Resource: "network-attachment-definitions"}
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
)

// multusNode is a node whose CNI is multus (the thin plugin, rig.Multus) in front of the rig's
// bridge network, with the recorder CNI (test/cni/recorder) as the delegate of the test's
// NetworkAttachmentDefinitions.
type multusNode struct {
	*node
	// dir is the test's: multus's configuration, cache and log, the recorder's file, the
	// directories multus's mount namespace is given.
	dir string
	// records is the recorder's file.
	records string
	// root is bound at /var/lib/kubelet in multus's mount namespace: its
	// pod-resources/kubelet.sock is the socket multus reads (useSocket).
	root string
	dyn  dynamic.Interface
}

// multusWrapper is the CNI binary "multus" containerd runs: a shell script that gives the real
// multus (v4.3.0 reads PodResources only at /var/lib/kubelet/pod-resources/kubelet.sock and
// device information only under /var/run/k8s.cni.cncf.io; no flag or key moves them) the test's
// directories at those paths, in a mount namespace of its own: unshare -m with private
// propagation, so that nothing mounted there reaches the host's, and it ends with the process.
//
//   - /var/lib/kubelet: the test's root (%[1]s) is bound over it. It is never created: the
//     cluster's kubelet makes /var/lib/kubelet/device-plugins (a path fixed in the kubelet) at
//     its start, and without it the wrapper fails the CNI call, saying so, rather than write a
//     directory into the host's /var/lib.
//   - /var/run (→ /run): a tmpfs hides the host's, in which k8s.cni.cncf.io is made and the
//     test's directory (%[2]s) bound. multus and its delegates need nothing else there: the
//     pods' network namespaces and the IPAM stores are in the rig's and the test's directories,
//     multus's delegate cache (cniDir) in the test's, and nothing in the chain takes the
//     iptables lock (no masquerade).
//
// %[3]s is the real multus. Stdin (the network configuration) and the CNI_* environment pass
// through unshare and exec unchanged.
const multusWrapper = `#!/bin/sh
if [ -z "$PGMULTUS_UNSHARED" ]; then
	PGMULTUS_UNSHARED=1 exec unshare -m --propagation private "$0" "$@"
fi
fail() {
	printf '{"cniVersion":"0.3.1","code":999,"msg":"pgmultus wrapper: %%s"}\n' "$1"
	exit 1
}
[ -d /var/lib/kubelet ] || fail "no /var/lib/kubelet to cover (the cluster's kubelet makes /var/lib/kubelet/device-plugins): not creating one on the host"
mount --bind %[1]q /var/lib/kubelet || fail "bind the test's kubelet root"
mount -t tmpfs -o mode=0755,size=1m pgmultus /var/run || fail "tmpfs on /var/run"
mkdir /var/run/k8s.cni.cncf.io && mount --bind %[2]q /var/run/k8s.cni.cncf.io || fail "bind the test's device information"
exec %[3]q "$@"
`

// startMultusNode starts a node (startNodeOf) whose CNI is multus, podgate in front of the
// kubelet with draKeys more keys of podgate's dra section (YAML lines, "prepare: always"), the
// NetworkAttachmentDefinition CRD in its API server, and multus reading podgate's PodResources
// socket. It skips without root, the cluster, multus's build or unshare.
func startMultusNode(t testing.TB, draKeys ...string) *multusNode {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the rig runs containerd, the kubelet creates cgroups, multus's wrapper mounts")
	}
	if err := cluster.CheckInstalled(); err != nil {
		t.Skip(err.Error())
	}
	if err := rig.CheckNeighbour(rig.Multus); err != nil {
		t.Skip(err.Error())
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux) for multus's mount namespace: " + err.Error())
	}
	dir := testfs.ShortDir(t)
	m := &multusNode{dir: dir, records: filepath.Join(dir, "cni-record.jsonl"), root: filepath.Join(dir, "kubelet")}
	binDir := filepath.Join(dir, "bin")
	for _, d := range []string{binDir, filepath.Join(m.root, "pod-resources"), filepath.Join(dir, "devinfo")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	harness.BuildProgram(t, "github.com/podgate/podgate/test/cni/recorder", binDir, "pgrecorder")
	wrapper := fmt.Sprintf(multusWrapper, m.root, filepath.Join(dir, "devinfo"), rig.NeighbourBin(rig.Multus))
	if err := os.WriteFile(filepath.Join(binDir, "multus"), []byte(wrapper), 0o755); err != nil { //nolint:gosec // a CNI plugin must be executable
		t.Fatal(err)
	}
	// multus's kubeconfig is known once the cluster runs, after the rig has written multus's
	// configuration: the configuration names a copy made then, which outlives the cluster's
	// directory (the rig's Down stops what sandboxes are left after the cluster's, and multus's
	// DEL needs a kubeconfig even when the API server is gone).
	kubeconfig := filepath.Join(dir, "kubeconfig")
	rigOpts := rig.Options{CNIBinDir: binDir, CNIConfig: func(bridge string) string {
		return mustJSON(t, map[string]any{
			"cniVersion": "1.0.0", "name": "multus-cni-network",
			"plugins": []any{map[string]any{
				// The cluster network is the rig's bridge, named (pgrig) in the rig's
				// configuration directory rather than given by its file's path: multus v4.3.0
				// caches a delegate loaded from a .conflist path with only the fields it knows
				// (the bridge's name and IPAM ranges lost), and its DEL then fails ("no IP
				// ranges specified"); one found by name keeps its bytes.
				"type": "multus", "kubeconfig": kubeconfig, "clusterNetwork": "pgrig", "confDir": filepath.Dir(bridge),
				// Every directory multus would default to on the host is the test's.
				"cniDir": filepath.Join(dir, "multus-cache"), "binDir": binDir,
				"logFile": filepath.Join(dir, "multus.log"), "logLevel": "verbose",
			}},
		})
	}}
	// Registered before the node's cleanups, so that it runs after them: the rig's Down runs
	// multus's last DELs.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("multus log:\n%s", tail(filepath.Join(dir, "multus.log"), 40))
		}
	})
	n := startNodeOf(t, true, cluster.Options{}, func(c *cluster.Cluster) string {
		// startNodeOf's configuration ends with its dra section: draKeys continue it.
		var more strings.Builder
		for _, k := range draKeys {
			more.WriteString("  " + k + "\n")
		}
		return fmt.Sprintf("%spodResources:\n  kubeletSocket: %s\n", more.String(), c.PodResourcesSocket())
	}, rigOpts)
	m.node = n
	if b, err := os.ReadFile(n.cluster.Kubeconfig()); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(kubeconfig, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/var/lib/kubelet"); err != nil {
		t.Fatalf("the cluster's kubelet runs and the host has no /var/lib/kubelet for multus's wrapper to cover: %v", err)
	}
	m.useSocket(t, n.podgate.PodResourcesSocket)
	// Runs before the cluster's Down (cleanups run last first), which deletes the pods but may
	// stop the kubelet before it stopped their sandboxes: the rig's Down would then run
	// multus's DELs with the API server gone, each waiting 2.5 s for the pod. teardownPods waits
	// for the kubelet's stops, then removes the sandboxes with the kubelet stopped and the API
	// server still there.
	t.Cleanup(func() { n.teardownPods(t) })
	dyn, err := dynamic.NewForConfig(n.cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	m.dyn = dyn
	createNADCRD(t, dyn)
	return m
}

// TestMultusWrapperWithoutKubeletDir: on a host without /var/lib/kubelet (here one hidden by a
// tmpfs on /var/lib, in a mount namespace of the test's), multus's wrapper fails the CNI call
// with a CNI error saying why, before running multus, and creates no /var/lib/kubelet.
func TestMultusWrapperWithoutKubeletDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts in a mount namespace of its own")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("needs unshare (util-linux): " + err.Error())
	}
	dir := t.TempDir()
	wrapper := filepath.Join(dir, "multus")
	// /bin/false as multus: the call must fail before it runs.
	if err := os.WriteFile(wrapper, fmt.Appendf(nil, multusWrapper, dir, dir, "/bin/false"), 0o755); err != nil { //nolint:gosec // a CNI plugin must be executable
		t.Fatal(err)
	}
	script := `mount -t tmpfs pgtest /var/lib || exit 100
"$0"
status=$?
if [ -e /var/lib/kubelet ]; then echo "the wrapper created /var/lib/kubelet" >&2; exit 101; fi
exit $status`
	cmd := exec.CommandContext(t.Context(), "unshare", "-m", "--propagation", "private", "sh", "-c", script, wrapper)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("the wrapper: %v, want exit status 1\nstdout: %s\nstderr: %s", err, out, stderr.String())
	}
	var cniErr struct {
		Code int    `json:"code"`
		Msg  string `json:"msg"`
	}
	if err := json.Unmarshal(out, &cniErr); err != nil || cniErr.Code != 999 || !strings.Contains(cniErr.Msg, "no /var/lib/kubelet") {
		t.Errorf("the wrapper's output %s (%v), want a CNI error saying there is no /var/lib/kubelet", out, err)
	}
}

// useSocket makes socket the one multus reads at /var/lib/kubelet/pod-resources/kubelet.sock: a
// link in the root bound there, replaced in one rename so that no CNI ADD finds none (multus
// would then read the device plugins' checkpoint instead, silently).
func (m *multusNode) useSocket(t testing.TB, socket string) {
	t.Helper()
	link := filepath.Join(m.root, "pod-resources", "kubelet.sock")
	tmp := link + ".new"
	if err := os.Symlink(socket, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, link); err != nil {
		t.Fatal(err)
	}
}

// createNADCRD creates the NetworkAttachmentDefinition CRD as the Network Plumbing Working
// Group's specification defines the resource (k8s.cni.cncf.io/v1, namespaced, spec.config a
// string of CNI JSON) and waits until the API serves it.
func createNADCRD(t testing.TB, dyn dynamic.Interface) {
	t.Helper()
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": nadGVR.Resource + "." + nadGVR.Group},
		"spec": map[string]any{
			"group": nadGVR.Group, "scope": "Namespaced",
			"names": map[string]any{
				"plural": nadGVR.Resource, "singular": "network-attachment-definition",
				"kind": "NetworkAttachmentDefinition", "shortNames": []any{"net-attach-def"},
			},
			"versions": []any{map[string]any{
				"name": nadGVR.Version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type": "object",
					"properties": map[string]any{"spec": map[string]any{
						"type": "object", "properties": map[string]any{"config": map[string]any{"type": "string"}},
					}},
				}},
			}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(t.Context(), crd, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the NetworkAttachmentDefinition CRD: %v", err)
	}
	waitFor(t, time.Minute, "the API serving NetworkAttachmentDefinitions", func() (bool, error) {
		_, err := dyn.Resource(nadGVR).Namespace(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{})
		return err == nil, err
	})
}

// createNAD creates the NetworkAttachmentDefinition name in the default namespace for the
// pods' second interface, annotated with resourceName, so that multus reads PodResources for
// the pod's device of that name and gives its ID to the delegates. The delegates: macvlan on
// the rig's bridge (an interface in the pod, which multus's network-status reports; it goes
// with the pod's network namespace) with its own addresses, then the recorder, which records
// the deviceID and writes it as device information (capability CNIDeviceInfoFile).
func (m *multusNode) createNAD(t testing.TB, name, resourceName string) {
	t.Helper()
	conf := mustJSON(t, map[string]any{
		"cniVersion": "1.0.0", "name": name,
		"plugins": []any{
			map[string]any{
				"type": "macvlan", "master": m.rig.Bridge, "mode": "bridge",
				"ipam": map[string]any{
					"type": "host-local", "ranges": []any{[]any{map[string]any{"subnet": "10.79.0.0/24"}}},
					"dataDir": filepath.Join(m.dir, "ipam-"+name),
				},
			},
			map[string]any{"type": "pgrecorder", "recordFile": m.records, "capabilities": map[string]any{"CNIDeviceInfoFile": true}},
		},
	})
	nad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": nadGVR.GroupVersion().String(), "kind": "NetworkAttachmentDefinition",
		"metadata": map[string]any{
			"name": name, "namespace": metav1.NamespaceDefault,
			"annotations": map[string]any{resourceNameAnnotation: resourceName},
		},
		"spec": map[string]any{"config": conf},
	}}
	if _, err := m.dyn.Resource(nadGVR).Namespace(metav1.NamespaceDefault).Create(t.Context(), nad, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create NetworkAttachmentDefinition %s: %v", name, err)
	}
}

// networkStatus is one entry of multus's network-status annotation.
type networkStatus struct {
	Name       string   `json:"name"`
	Interface  string   `json:"interface"`
	IPs        []string `json:"ips"`
	Default    bool     `json:"default"`
	DeviceInfo *struct {
		Type string `json:"type"`
		PCI  struct {
			Address string `json:"pci-address"`
		} `json:"pci"`
	} `json:"device-info"`
}

// checkDelivered checks what multus did for the pod ns/name on network (namespace/name of the
// NetworkAttachmentDefinition): the delegate got deviceID at the pod's only CNI ADD (a second
// ADD would be a retried sandbox), and the pod's network-status shows the network's interface
// with that device.
func (m *multusNode) checkDelivered(t testing.TB, ns, name, network, deviceID string) {
	t.Helper()
	entries, err := record.Read(m.records)
	if err != nil {
		t.Fatalf("the recorder's file: %v", err)
	}
	adds := record.Find(entries, "ADD", ns, name)
	switch {
	case len(adds) != 1:
		t.Errorf("pod %s/%s: the delegate saw %d CNI ADDs, want 1 (no retried sandbox)", ns, name, len(adds))
	case adds[0].DeviceID != deviceID:
		t.Errorf("pod %s/%s: the delegate got deviceID %q, want %q", ns, name, adds[0].DeviceID, deviceID)
	}
	var statuses []networkStatus
	waitFor(t, time.Minute, "pod "+ns+"/"+name+"'s network-status", func() (bool, error) {
		pod, err := m.cluster.Client().CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s, ok := pod.Annotations[networkStatusAnnotation]
		if !ok {
			return false, errors.New("no network-status annotation")
		}
		return true, json.Unmarshal([]byte(s), &statuses)
	})
	i := slices.IndexFunc(statuses, func(s networkStatus) bool { return s.Name == network })
	if i < 0 {
		t.Errorf("pod %s/%s: network-status %+v has no %s", ns, name, statuses, network)
		return
	}
	s := statuses[i]
	if s.Interface == "" || len(s.IPs) == 0 || s.DeviceInfo == nil || s.DeviceInfo.PCI.Address != deviceID {
		t.Errorf("pod %s/%s: network-status of %s is %+v (device-info %+v), want an interface with addresses and device %q",
			ns, name, network, s, s.DeviceInfo, deviceID)
	}
}

// podgateLists is podgate's count of the v1 List calls it answered, and of those it failed
// (any code but OK: refused over a limit, Unavailable without the kubelet's part, ...).
func (m *multusNode) podgateLists(t testing.TB) (ok, failed float64) {
	t.Helper()
	metrics, err := m.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range metrics["podgate_podresources_requests_total"].GetMetric() {
		labels := map[string]string{}
		for _, l := range s.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["method"] != "/v1.PodResourcesLister/List" {
			continue
		}
		if labels["code"] == "OK" {
			ok += s.GetCounter().GetValue()
		} else {
			failed += s.GetCounter().GetValue()
		}
	}
	return ok, failed
}

// multusPod is a busybox pod on network (a NetworkAttachmentDefinition's name) asking for one
// device of vfResource.
func multusPod(name, node, network string) *corev1.Pod {
	pod := testPod(name, node)
	pod.Annotations = map[string]string{networksAnnotation: network}
	vf := corev1.ResourceList{vfResource: resource.MustParse("1")}
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: vf, Limits: vf}
	return pod
}

// startVFDevices registers a device plugin of vfResource with n devices vf0, vf1, ... and
// waits until the Node offers them.
func (m *multusNode) startVFDevices(t testing.TB, n int) {
	t.Helper()
	devices := make([]string, n)
	for i := range devices {
		devices[i] = fmt.Sprintf("vf%d", i)
	}
	plugin := startDevicePlugin(t, m.cluster.PluginRegistryDir(), vfResource, devices)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := plugin.waitRegistered(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the node's allocatable "+vfResource, func() (bool, error) {
		node, err := m.cluster.Client().CoreV1().Nodes().Get(t.Context(), m.cluster.NodeName(), metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		q := node.Status.Allocatable[vfResource]
		return q.Value() == int64(n), nil
	})
}

// TestMultusDevicePlugin: a pod on a network whose NetworkAttachmentDefinition names a device
// plugin's resource, on the real kubelet through podgate, with multus v4.3.0 as the node's CNI
// reading podgate's PodResources socket where it reads the kubelet's. The delegate gets the
// device the kubelet allocated (the kubelet's own List says which), through podgate's merge, and
// the pod's network-status shows it; multus asked podgate.
func TestMultusDevicePlugin(t *testing.T) {
	m := startMultusNode(t)
	c := m.cluster
	m.startVFDevices(t, 4)
	m.createNAD(t, "vfnet", vfResource)

	lists, _ := m.podgateLists(t)
	pod := multusPod("vf-multus", c.NodeName(), "vfnet")
	if _, err := c.Client().CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c, pod.Namespace, pod.Name)
	key := pod.Namespace + "/" + pod.Name
	want := kubeletDevices(t, c, []string{key})[key][0]
	m.checkDelivered(t, pod.Namespace, pod.Name, "default/vfnet", want)
	if got, _ := m.podgateLists(t); got-lists < 1 {
		t.Errorf("podgate answered %v v1 List calls during the pod's start, want multus's", got-lists)
	}
	t.Logf("the delegate got %s, the kubelet's device for %s", want, key)
}

// draPrefix names the test driver's host interfaces in these tests: pgmu0, pgmu1, ... (the
// host's, so not the other tests' pgnic).
const draPrefix = "pgmu"

// TestMultusDRAClaim: a pod whose network device is a DRA claim of the pod (no container names
// it, as a network device's usually is), prepared by podgate (dra.prepare: always: the
// kubelet 1.36 prepares it too, and lists it under no container) with the test driver, which
// names a CDI device per prepared device. multus v4.3.0 reads containers[].dynamic_resources
// by claim name and takes each CDI device's name after "=" as the device ID: through podgate's
// List, which lists the pod's claim under its containers, the delegate gets the claim's device
// and the pod's network-status shows it.
func TestMultusDRAClaim(t *testing.T) {
	if os.Geteuid() == 0 {
		if err := dranode.RemoveLinks(draPrefix); err != nil { // a failed run's
			t.Fatal(err)
		}
	}
	var driver *dranode.Driver
	// Registered before the node's cleanups, so that it runs after them: the kubelet stops
	// the pods, and unprepares their claims, with the driver still there.
	t.Cleanup(func() {
		if driver != nil {
			if err := driver.Stop(); err != nil {
				t.Error(err)
			}
		}
		if err := dranode.RemoveLinks(draPrefix); err != nil {
			t.Error(err)
		}
	})
	m := startMultusNode(t, "prepare: always")
	c := m.cluster
	harness.BuildProgram(t, "github.com/podgate/podgate/test/dradriver", m.dir, "dradriver")
	var err error
	driver, err = dranode.StartDriver(dranode.DriverConfig{
		Bin: filepath.Join(m.dir, "dradriver"), NodeName: c.NodeName(), Kubeconfig: c.Kubeconfig(),
		RegistryDir: c.PluginRegistryDir(), PluginDir: filepath.Join(c.PluginsDir(), dranode.DriverName),
		EventsFile: filepath.Join(m.dir, "dra-events.jsonl"), LogDir: m.dir, InterfacePrefix: draPrefix,
		CDIDir: filepath.Join(m.dir, "cdi"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := dranode.WaitSlice(t.Context(), c.Client(), c.NodeName(), time.Minute); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "podgate finding the DRA driver", func() (bool, error) {
		metrics, err := m.podgate.Scrape(t.Context())
		if err != nil {
			return false, err
		}
		v, _ := metrics.Value("podgate_dra_drivers", "driver", dranode.DriverName)
		return v == 1, nil
	})

	// multus v4.3.0 keys a claim's devices by the ResourceClaim's name: the NAD's resourceName
	// is the claim's, which dranode names after the pod.
	const name = "nic-multus"
	m.createNAD(t, "nicnet", name)
	lists, _ := m.podgateLists(t)
	pod, err := dranode.Pod{
		Namespace: metav1.NamespaceDefault, Name: name, Node: c.NodeName(), Device: 0, PodLevel: true,
		Annotations: map[string]string{networksAnnotation: "nicnet"},
	}.Create(t.Context(), c.Client())
	if err != nil {
		t.Fatal(err)
	}
	waitRunning(t, c, pod.Namespace, pod.Name)
	claim, err := c.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := cdiDeviceName(t, filepath.Join(m.dir, "cdi"), claim.UID)
	m.checkDelivered(t, pod.Namespace, pod.Name, "default/nicnet", want)
	if got, _ := m.podgateLists(t); got-lists < 1 {
		t.Errorf("podgate answered %v v1 List calls during the pod's start, want multus's", got-lists)
	}
	// What multus would have read on the kubelet's socket: the pod, without the claim.
	if claims := kubeletClaims(t, c, pod.Namespace, pod.Name); len(claims) != 0 {
		t.Errorf("the kubelet's own List shows claims %v of the pod-level claim's pod: this test no longer shows what podgate adds", claims)
	}
	t.Logf("the delegate got %s, the CDI device of claim %s", want, name)
}

// kubeletClaims is the claims the kubelet's own List shows under the pod's containers.
func kubeletClaims(t testing.TB, c *cluster.Cluster, ns, name string) []string {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+c.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := v1.NewPodResourcesListerClient(conn).List(t.Context(), &v1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("the kubelet's List: %v", err)
	}
	var claims []string
	found := false
	for _, pr := range resp.GetPodResources() {
		if pr.GetNamespace() != ns || pr.GetName() != name {
			continue
		}
		found = true
		for _, ctr := range pr.GetContainers() {
			for _, dr := range ctr.GetDynamicResources() {
				claims = append(claims, ctr.GetName()+":"+dr.GetClaimName())
			}
		}
	}
	if !found {
		t.Fatalf("the kubelet's List has no pod %s/%s", ns, name)
	}
	return claims
}

// cdiDeviceName is the name of the one CDI device the driver's specification for the claim
// (a file of cdiDir naming the claim's UID) holds: the part of its fully qualified name
// (<vendor>/<class>=<name>) after "=", which multus takes as the device ID.
func cdiDeviceName(t testing.TB, cdiDir string, claim types.UID) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(cdiDir, "*"+string(claim)+"*.json"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the CDI specification of claim %s in %s: %v, %v", claim, cdiDir, files, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Kind    string `json:"kind"`
		Devices []struct {
			Name string `json:"name"`
		} `json:"devices"`
	}
	if err := json.Unmarshal(b, &spec); err != nil || len(spec.Devices) != 1 {
		t.Fatalf("the CDI specification %s: %v, %s", files[0], err, b)
	}
	t.Logf("the claim's CDI device: %s=%s", spec.Kind, spec.Devices[0].Name)
	return spec.Devices[0].Name
}

// waitRunning waits until the pod runs; it fails the test at once if the pod failed.
func waitRunning(t testing.TB, c *cluster.Cluster, ns, name string) {
	t.Helper()
	waitPod(t, c, ns, name, func(p *corev1.Pod) bool {
		if p.Status.Phase == corev1.PodFailed {
			t.Fatalf("pod %s/%s failed: %s %s", ns, name, p.Status.Reason, p.Status.Message)
		}
		return p.Status.Phase == corev1.PodRunning
	})
}

// TestMultusBurst: multusBurst pods on the device plugin's network created at once, multus
// reading podgate's socket: every delegate gets the device the kubelet allocated to its pod,
// every pod's network-status shows it, podgate answers every multus List, and no sandbox is
// retried for want of pod resources (multus-cni#1545: with the kubelet's own socket, a List
// over its limit fails the CNI ADD and the kubelet retries the sandbox). Retries for other
// reasons are logged: multus gives each of its GETs of the pod 250 ms, which a loaded API server
// on two shared cores can miss.
func TestMultusBurst(t *testing.T) {
	m := startMultusNode(t)
	m.startVFDevices(t, multusBurst)
	m.createNAD(t, "vfnet", vfResource)
	lists, _ := m.podgateLists(t)
	kubelet := m.podgateKubeletLists(t)
	r := m.burst(t, "burst")
	if r.podResourcesRetries != 0 {
		t.Errorf("%d sandboxes of the burst were retried for want of pod resources, want none", r.podResourcesRetries)
	}
	ok, failed := m.podgateLists(t)
	if failed != 0 || ok-lists < multusBurst {
		t.Errorf("podgate answered %v v1 List calls and failed %v, want at least %d (one per multus ADD), none failed", ok-lists, failed, multusBurst)
	}
	t.Logf("%d pods through multus and podgate's socket: all running %s after the first was created, the last delegate's ADD at %s; %d sandboxes retried for other reasons; podgate answered %v Lists and asked the kubelet %v times",
		multusBurst, r.running.Round(time.Millisecond), r.cniAdds.Round(time.Millisecond), r.retries-r.podResourcesRetries, ok-lists, m.podgateKubeletLists(t)-kubelet)
}

// BenchmarkMultusBurst: the burst of TestMultusBurst (multusBurst pods at once on the device
// plugin's network, multus v4.3.0 as the CNI) with multus reading podgate's PodResources socket,
// and the same burst with multus reading the kubelet's own socket, on one node in one run: the
// two alternate (which goes first alternates too), each burst's pods deleted and their devices
// freed before the next. Reported per burst, in ms: until every pod runs (running) and until
// the last delegate's CNI ADD (cni), for each socket, and podgate's over the kubelet's; the
// sandboxes retried (FailedCreatePodSandBox) with each, and those of them for want of pod
// resources. One of those with podgate's socket fails the benchmark; with the kubelet's it is
// what the benchmark measures.
//
//	go test -run '^$' -bench MultusBurst -benchtime 3x -timeout 40m ./test/cluster
func BenchmarkMultusBurst(b *testing.B) {
	m := startMultusNode(b)
	m.startVFDevices(b, multusBurst)
	m.createNAD(b, "vfnet", vfResource)
	sockets := [2]struct{ name, path string }{
		{"podgate", m.podgate.PodResourcesSocket}, {"kubelet", m.cluster.PodResourcesSocket()},
	}
	var total [2]burstResult
	bursts := 0
	for b.Loop() {
		for j := range sockets {
			k := (bursts + j) % len(sockets)
			m.useSocket(b, sockets[k].path)
			prefix := fmt.Sprintf("b%d-%s", bursts, sockets[k].name)
			r := m.burst(b, prefix)
			m.removeBurst(b, prefix)
			b.Logf("burst %s: running %s, last CNI ADD %s, %d retried (%d for pod resources)", prefix,
				r.running.Round(time.Millisecond), r.cniAdds.Round(time.Millisecond), r.retries, r.podResourcesRetries)
			total[k].running += r.running
			total[k].cniAdds += r.cniAdds
			total[k].retries += r.retries
			total[k].podResourcesRetries += r.podResourcesRetries
		}
		bursts++
	}
	ms := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(bursts) }
	pg, kl := total[0], total[1]
	b.ReportMetric(ms(pg.running), "podgate-running-ms")
	b.ReportMetric(ms(kl.running), "kubelet-running-ms")
	b.ReportMetric(float64(pg.running)/float64(kl.running), "running-ratio")
	b.ReportMetric(ms(pg.cniAdds), "podgate-cni-ms")
	b.ReportMetric(ms(kl.cniAdds), "kubelet-cni-ms")
	b.ReportMetric(float64(pg.cniAdds)/float64(kl.cniAdds), "cni-ratio")
	b.ReportMetric(float64(pg.retries), "podgate-retries")
	b.ReportMetric(float64(kl.retries), "kubelet-retries")
	b.ReportMetric(float64(pg.podResourcesRetries), "podgate-podresources-retries")
	b.ReportMetric(float64(kl.podResourcesRetries), "kubelet-podresources-retries")
	if pg.podResourcesRetries > 0 {
		b.Errorf("%d sandboxes retried for want of pod resources with podgate's socket, want none", pg.podResourcesRetries)
	}
}

// burstResult is what one burst of multusBurst pods took.
type burstResult struct {
	// running is from the first pod's creation to the last pod seen running.
	running time.Duration
	// cniAdds is from the first pod's creation to the last delegate's CNI ADD.
	cniAdds time.Duration
	// retries counts the burst's FailedCreatePodSandBox events: a multus ADD that failed
	// fails the sandbox, which the kubelet retries.
	retries int
	// podResourcesRetries are those of retries whose multus ADD failed reading pod resources
	// (PodResources refused or unavailable), the kind multus-cni#1545 is about.
	podResourcesRetries int
}

// podResourcesFailure matches multus v4.3.0's errors from reading pod resources
// (pkg/k8sclient: "failed to get a ResourceClient instance", "failed to get resourceMap from
// ResourceClient"; pkg/kubeletclient: "error getting pod resources from client").
var podResourcesFailure = regexp.MustCompile(`ResourceClient|pod resources`)

// burst creates multusBurst pods on the network vfnet at once, named prefix-N and labelled
// burst=prefix, waits until they all run, and checks each (checkDelivered: the device the
// kubelet allocated reached the delegate and the network-status, at the pod's only ADD).
func (m *multusNode) burst(t testing.TB, prefix string) burstResult {
	t.Helper()
	c := m.cluster
	pods := c.Client().CoreV1().Pods(metav1.NamespaceDefault)
	w, err := pods.Watch(t.Context(), metav1.ListOptions{LabelSelector: "burst=" + prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	errs := make([]error, multusBurst)
	ready := make(chan struct{})
	var wg sync.WaitGroup
	for i := range multusBurst {
		pod := multusPod(fmt.Sprintf("%s-%d", prefix, i), c.NodeName(), "vfnet")
		pod.Labels = map[string]string{"burst": prefix}
		wg.Go(func() {
			<-ready
			_, errs[i] = pods.Create(t.Context(), pod, metav1.CreateOptions{})
		})
	}
	start := time.Now()
	close(ready)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	running := map[string]time.Time{}
	deadline := time.After(3 * time.Minute)
	for len(running) < multusBurst {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch of the burst's pods ended")
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("pod %s failed: %s %s", p.Name, p.Status.Reason, p.Status.Message)
			}
			if _, seen := running[p.Name]; !seen && p.Status.Phase == corev1.PodRunning {
				running[p.Name] = time.Now()
			}
		case <-deadline:
			t.Fatalf("burst %s: %d of %d pods running after 3 minutes", prefix, len(running), multusBurst)
		}
	}
	var r burstResult
	keys := make([]string, 0, multusBurst)
	for name, at := range running {
		r.running = max(r.running, at.Sub(start))
		keys = append(keys, metav1.NamespaceDefault+"/"+name)
	}
	slices.Sort(keys)
	want := kubeletDevices(t, c, keys)
	for _, k := range keys {
		ns, name, _ := strings.Cut(k, "/")
		m.checkDelivered(t, ns, name, "default/vfnet", want[k][0])
	}
	entries, err := record.Read(m.records)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Command == "ADD" && strings.HasPrefix(e.Pod.Name, prefix+"-") {
			r.cniAdds = max(r.cniAdds, e.Time.Sub(start))
		}
	}
	events, err := c.Client().CoreV1().Events(metav1.NamespaceDefault).List(t.Context(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("reason", "FailedCreatePodSandBox").String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if _, ok := running[e.InvolvedObject.Name]; ok {
			n := int(max(e.Count, 1))
			r.retries += n
			if podResourcesFailure.MatchString(e.Message) {
				r.podResourcesRetries += n
			}
			t.Logf("retried %d times: %s: %s", n, e.InvolvedObject.Name, e.Message)
		}
	}
	return r
}

// removeBurst deletes the burst's pods and waits until the kubelet has let their devices go (its
// own PodResources List shows none of them: it allocates from the same active pods) and has
// stopped their sandboxes to the end (waitStopped: multus's DELs done, not only the pause
// processes), so that the next burst starts on a quiet node with the devices free.
func (m *multusNode) removeBurst(t testing.TB, prefix string) {
	t.Helper()
	c := m.cluster
	sel := metav1.ListOptions{LabelSelector: "burst=" + prefix}
	err := c.Client().CoreV1().Pods(metav1.NamespaceDefault).DeleteCollection(t.Context(), metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, sel)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("unix://"+c.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, 2*time.Minute, "the kubelet letting burst "+prefix+" go", func() (bool, error) {
		resp, err := v1.NewPodResourcesListerClient(conn).List(t.Context(), &v1.ListPodResourcesRequest{})
		if err != nil {
			return false, err
		}
		for _, pr := range resp.GetPodResources() {
			if strings.HasPrefix(pr.GetName(), prefix+"-") {
				return false, fmt.Errorf("the kubelet still lists %s", pr.GetName())
			}
		}
		return true, nil
	})
	err = waitStopped(t.Context(), m.containerd.Runtime, &runtimeapi.PodSandboxFilter{LabelSelector: map[string]string{"burst": prefix}})
	if err != nil {
		t.Fatalf("the kubelet stopping burst %s: %v", prefix, err)
	}
}

// podgateKubeletLists is podgate's count of the List calls it made to the kubelet's socket that
// the kubelet answered.
func (m *multusNode) podgateKubeletLists(t testing.TB) float64 {
	t.Helper()
	metrics, err := m.podgate.Scrape(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	v, _ := metrics.Value("podgate_podresources_kubelet_requests_total", "method", "List", "result", "ok")
	return v
}

// mustJSON is v as JSON.
func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// tail is the last n lines of the file at path, or why there are none.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "(none)"
	}
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

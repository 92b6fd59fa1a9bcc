//go:build linux

package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/rig"
)

// DRAExampleNetDriver is the name dra-example-driver's kubelet plugin takes with its net profile
// (<profile>.example.com, as its Helm chart names it): its ResourceSlice's driver, its
// DeviceClass's name, the vendor of its CDI devices (k8s.net.example.com/net=...).
const DRAExampleNetDriver = "net.example.com"

// draExampleProfile is the driver's device profile, also the class of its CDI devices.
const draExampleProfile = "net"

// draExampleStopGrace is how long the driver has to exit on SIGTERM: it stops its gRPC servers,
// which removes its sockets, and needs no more than a second here.
const draExampleStopGrace = 10 * time.Second

// DRAExampleDriver is dra-example-driver's kubelet plugin (rig.DRAExampleDriver, built by
// test/rig/install.sh neighbours at the version neighbours.env pins) with its net profile,
// running beside a cluster: simulated NICs nic-0 ... nic-<N-1> published in a ResourceSlice of
// the cluster's node, a registration socket in the cluster's plugin registry (never the host's
// /var/lib/kubelet), its DRA socket and checkpoint under the cluster's plugins directory, and
// one CDI spec file per prepared claim under a CDI root of the caller's (never /var/run/cdi or
// /etc/cdi, where the host's runtimes look). It is neither a container nor in a mount namespace
// of its own: every path it uses is given by a flag.
type DRAExampleDriver struct {
	// CDIRoot is its --cdi-root.
	CDIRoot string
	// LogPath is its log (klog text), appended to by every start.
	LogPath string

	c       *Cluster
	devices int
	proc    *process
}

// DRAExampleOptions configure the driver.
type DRAExampleOptions struct {
	// CDIRoot is where it writes CDI spec files; it creates the directory. Required.
	CDIRoot string
	// LogPath is the file its output is appended to. Required.
	LogPath string
	// Devices is the number of NICs it simulates (--num-devices); 0 means 4.
	Devices int
}

// NewDRAExampleDriver returns the driver for the cluster, not started yet, or an error wrapping
// ErrNotInstalled when the neighbour is not built (the test skips with it).
func NewDRAExampleDriver(c *Cluster, o DRAExampleOptions) (*DRAExampleDriver, error) {
	if err := rig.CheckNeighbour(rig.DRAExampleDriver); err != nil {
		return nil, err
	}
	if o.CDIRoot == "" || o.LogPath == "" {
		return nil, errors.New("dra-example-driver: CDIRoot and LogPath are required")
	}
	if o.Devices == 0 {
		o.Devices = 4
	}
	return &DRAExampleDriver{CDIRoot: o.CDIRoot, LogPath: o.LogPath, c: c, devices: o.Devices}, nil
}

// Start starts the driver, again after Stop or Kill: it registers in the cluster's plugin registry and publishes its
// ResourceSlice on its own once it runs (WaitPublished). Its healthcheck and metrics servers
// stay off (their default), so that it listens on no TCP port: they would bind every interface.
// The kernel kills it if the test binary dies.
func (d *DRAExampleDriver) Start() error {
	if d.proc != nil {
		return errors.New("dra-example-driver: already started")
	}
	p, err := startProcess("dra-example-driver", d.LogPath, rig.NeighbourBin(rig.DRAExampleDriver),
		"--node-name", d.c.NodeName(), "--kubeconfig", d.c.Kubeconfig(),
		"--device-profile", draExampleProfile, "--num-devices", strconv.Itoa(d.devices),
		"--cdi-root", d.CDIRoot,
		"--kubelet-registrar-directory-path", d.c.PluginRegistryDir(),
		"--kubelet-plugins-directory-path", d.c.PluginsDir())
	if err != nil {
		return err
	}
	d.proc = p
	return nil
}

// Stop stops the driver with SIGTERM, on which it closes its sockets (Go removes a unix socket
// it created when it closes the listener), and waits for it; a driver not running is no error.
func (d *DRAExampleDriver) Stop() error {
	p := d.proc
	if p == nil {
		return nil
	}
	d.proc = nil
	if done, err := p.exited(); done && err != nil {
		// It died on its own before it was asked to stop.
		return p.exitError(err)
	}
	return p.stop(draExampleStopGrace)
}

// Kill kills the driver with SIGKILL, as the OOM killer or a node's crash would: it leaves its
// registration and DRA sockets behind, with nobody listening on them.
func (d *DRAExampleDriver) Kill() error {
	p := d.proc
	if p == nil {
		return errors.New("dra-example-driver: not started")
	}
	d.proc = nil
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill dra-example-driver: %w", err)
	}
	<-p.done
	return nil
}

// RegistrationSocket is the driver's registration socket in the cluster's plugin registry, the
// kubeletplugin helper's default name <driver>-reg.sock.
func (d *DRAExampleDriver) RegistrationSocket() string {
	return filepath.Join(d.c.PluginRegistryDir(), DRAExampleNetDriver+"-reg.sock")
}

// ClaimSpecFile is the CDI spec file the driver writes when it prepares the claim with uid and
// removes when it unprepares it: the CDI library's transient spec name for vendor
// k8s.net.example.com, class net and the claim's UID, with its default extension.
func (d *DRAExampleDriver) ClaimSpecFile(uid types.UID) string {
	return filepath.Join(d.CDIRoot, "k8s."+DRAExampleNetDriver+"-"+draExampleProfile+"_"+string(uid)+".yaml")
}

// ClaimCDIDevice is the CDI device the driver hands out for the claim with uid on device (an
// unshared device: no share ID in its name).
func ClaimCDIDevice(uid types.UID, device string) string {
	return "k8s." + DRAExampleNetDriver + "/" + draExampleProfile + "=" + string(uid) + "-" + device
}

// Prepares are the driver's log lines of its NodePrepareResources work for the claim with uid:
// the plugin logs `"Preparing claim" uid=...` once per claim of each call, whoever calls
// (cmd/dra-example-kubeletplugin/driver.go). Its metrics would not tell claims apart.
func (d *DRAExampleDriver) Prepares(uid types.UID) ([]string, error) {
	b, err := os.ReadFile(d.LogPath)
	if err != nil {
		return nil, fmt.Errorf("dra-example-driver log: %w", err)
	}
	var lines []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(line, `"Preparing claim"`) && strings.Contains(line, fmt.Sprintf("uid=%q", uid)) {
			lines = append(lines, line)
		}
	}
	return lines, nil
}

// LogTail is the end of the driver's log, for failure messages.
func (d *DRAExampleDriver) LogTail() string { return logTail(d.LogPath, 40) }

// WaitPublished waits until the driver has registered (its registration socket exists) and
// published its ResourceSlice for the cluster's node with devices nic-0 ... nic-<N-1>, as the
// net profile names them; it fails early when the driver exits.
func (d *DRAExampleDriver) WaitPublished(ctx context.Context, timeout time.Duration) error {
	want := make([]string, d.devices)
	for i := range want {
		want[i] = fmt.Sprintf("nic-%d", i)
	}
	p := d.proc
	if p == nil {
		return errors.New("dra-example-driver: not started")
	}
	var last []string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if done, err := p.exited(); done {
			return false, p.exitError(err)
		}
		if _, err := os.Stat(d.RegistrationSocket()); err != nil {
			return false, nil
		}
		list, err := d.c.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil // the API may be busy: try again
		}
		last = sliceDevices(list.Items, d.c.NodeName())
		return equalSorted(last, want), nil
	})
	if err != nil {
		return fmt.Errorf("dra-example-driver on node %s: devices %v published, want %v: %w", d.c.NodeName(), last, want, err)
	}
	return nil
}

// sliceDevices are the names of the devices the driver publishes for node.
func sliceDevices(items []resourceapi.ResourceSlice, node string) []string {
	var names []string
	for _, s := range items {
		if s.Spec.Driver == DRAExampleNetDriver && s.Spec.NodeName != nil && *s.Spec.NodeName == node {
			for _, dev := range s.Spec.Devices {
				names = append(names, dev.Name)
			}
		}
	}
	return names
}

func equalSorted(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// CreateDRAExampleDeviceClass creates the driver's DeviceClass, as its Helm chart does
// (deployments/helm/dra-example-driver/templates/deviceclass.yaml): every device of the driver.
func CreateDRAExampleDeviceClass(ctx context.Context, kube kubernetes.Interface) error {
	_, err := kube.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: DRAExampleNetDriver},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == '%s'", DRAExampleNetDriver)},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create DeviceClass %s: %w", DRAExampleNetDriver, err)
	}
	return nil
}

// DRAExamplePod is a pod with one claim, of the same name, on one NIC of the driver. The claim
// is the pod's (no container names it), as a network device's usually is: the containers get
// none of its CDI devices, which containerd would look up in its own CDI directories
// (/etc/cdi, /var/run/cdi by default), not in the driver's CDIRoot.
type DRAExamplePod struct {
	Namespace, Name string
	// Node is the node the pod is bound to, and the device's pool (the net profile's pool is
	// the node's name).
	Node string
	// Device is the NIC, e.g. nic-0.
	Device string
}

// Create makes the claim, the pod using it, allocates the claim to the device and reserves it
// for the pod (as the scheduler would; there is none), then binds the pod: in that order, a
// kubelet never tries to prepare an unreserved claim (kubernetes#139836). It returns the pod as
// bound and the claim as allocated.
func (p DRAExamplePod) Create(ctx context.Context, kube kubernetes.Interface) (*corev1.Pod, *resourceapi.ResourceClaim, error) {
	claims := kube.ResourceV1().ResourceClaims(p.Namespace)
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DRAExampleNetDriver},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create claim %s/%s: %w", p.Namespace, p.Name, err)
	}
	pod, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, p.pod(), metav1.CreateOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "nic", Driver: DRAExampleNetDriver, Pool: p.Node, Device: p.Device,
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{p.Node}}},
		}}},
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if claim, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("allocate claim %s/%s: %w", p.Namespace, p.Name, err)
	}
	if err := kube.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: p.Node},
	}, metav1.CreateOptions{}); err != nil {
		return nil, nil, fmt.Errorf("bind pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	pod.Spec.NodeName = p.Node
	return pod, claim, nil
}

// pod is the pod before it is bound: a busybox that sleeps, with the claim.
func (p DRAExamplePod) pod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To(p.Name)}},
			Containers: []corev1.Container{{
				Name: "c", Image: rig.BusyboxImage,
				ImagePullPolicy: corev1.PullNever, // imported by the rig; no registry is reachable
				Command:         []string{"sleep", "3600"},
			}},
		},
	}
}

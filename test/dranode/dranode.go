// Package dranode does on a real node what the scheduler, the API server's clients and the
// kubelet would do for a pod with a DRA network claim, for the end-to-end tests and the demo:
// it runs the test DRA driver (test/dradriver) as a process, makes a ResourceClaim allocated to
// one of the driver's devices and a pod using it, reserves the claim for the pod and binds the
// pod, and builds the sandbox config a kubelet would send for the pod. It also reads what the
// driver and the recording CNI plugin (test/cni/recorder) logged, and cleans up the host
// interfaces the driver makes.
package dranode

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/podgate/podgate/test/cni/record"
	"github.com/podgate/podgate/test/dradriver/driver"
	"github.com/podgate/podgate/test/rig"
)

// DriverName is the test driver's name; its devices nicN are the host interfaces <prefix>N,
// pgnicN unless DriverConfig.InterfacePrefix says otherwise.
const DriverName = driver.DefaultDriverName

// DriverConfig is how to run the test driver.
type DriverConfig struct {
	// Bin is the driver's binary (go build ./test/dradriver).
	Bin string
	// NodeName and Kubeconfig: the node whose ResourceSlice the driver publishes, and the API.
	NodeName, Kubeconfig string
	// RegistryDir is the kubelet's plugin registry the driver registers in; PluginDir holds its
	// DRA socket and state.
	RegistryDir, PluginDir string
	// EventsFile receives one line per claim prepared or unprepared (driver.ReadEvents).
	EventsFile string
	// CDIDir is where the driver writes a CDI spec per prepared claim; empty writes none, and
	// then the driver's answer to NodePrepareResources names no CDI device.
	CDIDir string
	// LogDir receives the driver's log, a new file per start.
	LogDir string
	// InterfacePrefix names the driver's host interfaces (<prefix>N, peers <prefix>Np); empty
	// means the driver's default, pgnic. Programs that may run beside each other (the demo and
	// the end-to-end tests under go test ./...) each use their own, since the interfaces are
	// the host's.
	InterfacePrefix string
}

// Driver is the test driver running as a process.
type Driver struct {
	cmd *exec.Cmd
	log *os.File
}

// StartDriver starts the driver; it registers and serves on its own once it runs.
func StartDriver(c DriverConfig) (*Driver, error) {
	args := []string{
		"--node-name", c.NodeName, "--kubeconfig", c.Kubeconfig,
		"--registry-dir", c.RegistryDir, "--plugin-dir", c.PluginDir,
		"--cdi-dir", c.CDIDir, "--events-file", c.EventsFile,
	}
	if c.InterfacePrefix != "" {
		args = append(args, "--interface-prefix", c.InterfacePrefix)
	}
	cmd := exec.Command(c.Bin, args...)
	dieWithParent(cmd)
	log, err := os.Create(filepath.Join(c.LogDir, fmt.Sprintf("dradriver-%d.log", time.Now().UnixNano())))
	if err != nil {
		return nil, fmt.Errorf("start DRA driver: %w", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, errors.Join(fmt.Errorf("start DRA driver: %w", err), log.Close())
	}
	return &Driver{cmd: cmd, log: log}, nil
}

// Stop stops the driver with SIGTERM, on which it removes its sockets, and waits for it.
func (d *Driver) Stop() error {
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop DRA driver: %w", err)
	}
	var exit *exec.ExitError
	if err := d.cmd.Wait(); err != nil && !errors.As(err, &exit) {
		return errors.Join(fmt.Errorf("stop DRA driver: %w", err), d.log.Close())
	}
	return d.log.Close()
}

// Pod is a pod with one DRA network claim, of the same name, on device nicDevice of the test
// driver.
type Pod struct {
	Namespace, Name string
	// Node is the node the pod is bound to, and the pool of the device.
	Node string
	// Device is N of the driver's device nicN.
	Device int
	// Opaque is the claim's configuration for the driver (JSON), e.g. the interface's name in
	// the pod; empty for none.
	Opaque string
	// PodLevel leaves the claim out of every container's resources.claims: the claim is the
	// pod's, as a network device's usually is.
	PodLevel bool
	// Image is the container's image; empty means the rig's busybox.
	Image string
	// Labels are the pod's labels.
	Labels map[string]string
	// Annotations are the pod's annotations, e.g. the networks a meta-CNI plugin attaches.
	Annotations map[string]string
}

// Create makes the claim (allocated to the device, as the scheduler would) and the pod using
// it, reserves the claim for the pod and binds the pod to the node, in the order that keeps a
// kubelet from trying to prepare an unreserved claim (kubernetes#139836). It returns the pod
// as bound.
func (p Pod) Create(ctx context.Context, kube kubernetes.Interface) (*corev1.Pod, error) {
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DriverName},
	}}}}
	if p.Opaque != "" {
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: []byte(p.Opaque)}},
		}}}
	}
	claims := kube.ResourceV1().ResourceClaims(p.Namespace)
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: p.Name}, Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create claim %s/%s: %w", p.Namespace, p.Name, err)
	}
	image := p.Image
	if image == "" {
		image = rig.BusyboxImage
	}
	ctr := corev1.Container{
		Name: "c", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
		Command:   []string{"sleep", "3600"},
		Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "nic"}}},
	}
	if p.Image == "" {
		ctr.ImagePullPolicy = corev1.PullNever
	}
	if p.PodLevel {
		ctr.Resources.Claims = nil
	}
	pod, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Labels: p.Labels, Annotations: p.Annotations},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "nic", ResourceClaimName: ptr.To(p.Name)}},
			Containers:                    []corev1.Container{ctr},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "nic", Driver: DriverName, Pool: p.Node, Device: fmt.Sprintf("nic%d", p.Device),
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{p.Node}}},
		}}},
	}
	// The scheduler copies the claim's configuration into the allocation.
	for _, c := range claim.Spec.Devices.Config {
		claim.Status.Allocation.Devices.Config = append(claim.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration,
		})
	}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("allocate claim %s/%s: %w", p.Namespace, p.Name, err)
	}
	if err := kube.CoreV1().Pods(p.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: p.Node},
	}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("bind pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	pod.Spec.NodeName = p.Node
	return pod, nil
}

// DeletePod deletes the pod at once (grace period 0), as a test's or the demo's end does.
func DeletePod(ctx context.Context, kube kubernetes.Interface, pod *corev1.Pod) error {
	err := kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil {
		return fmt.Errorf("delete pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// SandboxConfig is the sandbox config a kubelet sends for the pod: its metadata, and the labels
// that name it (io.kubernetes.pod.*) beside its own. Logs go below logDir.
func SandboxConfig(pod *corev1.Pod, logDir string) *runtimeapi.PodSandboxConfig {
	labels := map[string]string{
		"io.kubernetes.pod.uid": string(pod.UID), "io.kubernetes.pod.name": pod.Name, "io.kubernetes.pod.namespace": pod.Namespace,
	}
	for k, v := range pod.Labels {
		labels[k] = v
	}
	return &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		Hostname:     pod.Name,
		Labels:       labels,
		LogDirectory: filepath.Join(logDir, pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)),
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
}

// WaitSlice waits for the driver's ResourceSlice of node, which it publishes once the Node
// exists: podgate reads the host interface of an attached device there.
func WaitSlice(ctx context.Context, kube kubernetes.Interface, node string, timeout time.Duration) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		slices, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil // the API may be busy: try again
		}
		for _, s := range slices.Items {
			if s.Spec.Driver == DriverName && s.Spec.NodeName != nil && *s.Spec.NodeName == node && len(s.Spec.Devices) > 0 {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for the ResourceSlice of driver %s on node %s: %w", DriverName, node, err)
	}
	return nil
}

// Events returns what the driver logged in its events file about the claim, oldest first; a
// file not written yet holds none.
func Events(path, claim string) ([]driver.Event, error) {
	evs, err := driver.ReadEvents(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(evs, func(e driver.Event) bool { return e.Name != claim }), nil
}

// CNIAdd returns the recording CNI plugin's entry of the pod's first CNI ADD in its record file;
// ok is false when it recorded none.
func CNIAdd(path, namespace, pod string) (e record.Entry, ok bool, err error) {
	entries, err := record.Read(path)
	if errors.Is(err, fs.ErrNotExist) {
		return record.Entry{}, false, nil
	}
	if err != nil {
		return record.Entry{}, false, err
	}
	adds := record.Find(entries, "ADD", namespace, pod)
	if len(adds) == 0 {
		return record.Entry{}, false, nil
	}
	return adds[0], true, nil
}

// RecorderConf is the recording CNI plugin's entry in a CNI chain (binary pgrecorder): it
// records, at each ADD and DEL, which of the driver's host interfaces exist, those named with
// prefix, or the driver's default prefix (pgnic) when there is none.
func RecorderConf(recordFile string, prefix ...string) string {
	return fmt.Sprintf(`{"type": "pgrecorder", "recordFile": %q, "watchPrefixes": [%q]}`, recordFile, interfacePrefix(prefix))
}

func interfacePrefix(prefix []string) string {
	if len(prefix) > 0 && prefix[0] != "" {
		return prefix[0]
	}
	return driver.DefaultInterfacePrefix
}

// RemoveLinks deletes the host interfaces the driver makes (<prefix>N and its peer, pgnicN when
// no prefix is given), which a run that failed half-way may have left.
func RemoveLinks(prefix ...string) error {
	ifaces, err := net.Interfaces()
	if err != nil {
		return err
	}
	p := interfacePrefix(prefix)
	for _, i := range ifaces {
		if strings.HasPrefix(i.Name, p) {
			// Deleting one end of a veth pair deletes the other: "not found" is fine.
			_ = exec.Command("ip", "link", "del", i.Name).Run()
		}
	}
	return nil
}

// HostHasLink reports whether the host has an interface of that name.
func HostHasLink(name string) bool {
	_, err := net.InterfaceByName(name)
	return err == nil
}

package record

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
)

// NetConf is the recorder's network configuration, one plugin entry of a conflist:
//
//	{"type": "pgrecorder", "recordFile": "/tmp/x/cni-record.jsonl",
//	 "watchInterfaces": ["pgnic0", "pgnic1"], "watchPrefixes": ["pgnic"],
//	 "watchFiles": ["/tmp/x/cdi/*.yaml"]}
type NetConf struct {
	types.PluginConf
	// RecordFile is the JSON-lines file entries are appended to. Required.
	RecordFile string `json:"recordFile"`
	// WatchInterfaces are host interface names whose presence is recorded, present or not.
	WatchInterfaces []string `json:"watchInterfaces,omitempty"`
	// WatchPrefixes record every present host interface whose name starts with one of them.
	WatchPrefixes []string `json:"watchPrefixes,omitempty"`
	// WatchFiles are glob patterns (filepath.Match syntax) of host files whose existing matches
	// are recorded: a DRA driver's CDI spec files, which are named after a claim's UID that is
	// not known when the network configuration is written.
	WatchFiles []string `json:"watchFiles,omitempty"`
	// DeviceID is the device a meta plugin such as multus gave this delegate (from the pod's
	// resources, e.g. a device plugin's device or a DRA claim's CDI device name): recorded as
	// it came.
	DeviceID string `json:"deviceID,omitempty"`
	// RuntimeConfig holds what the runtime (or multus) passes for the capabilities the plugin's
	// configuration declares.
	RuntimeConfig RuntimeConfig `json:"runtimeConfig,omitempty"`
}

// RuntimeConfig is the part of a CNI runtimeConfig the recorder reads.
type RuntimeConfig struct {
	// CNIDeviceInfoFile is where multus wants the delegate's device information (capability
	// "CNIDeviceInfoFile"; multus sets it when the delegate has a deviceID), which multus puts
	// into the pod's network-status annotation.
	CNIDeviceInfoFile string `json:"CNIDeviceInfoFile,omitempty"`
}

// DeviceInfo is a network device's information as the Network Plumbing Working Group's
// device-info specification has a CNI plugin write it, for type "pci".
type DeviceInfo struct {
	Type    string `json:"type"`
	Version string `json:"version"`
	PCI     struct {
		Address string `json:"pci-address"`
	} `json:"pci"`
}

// WriteDeviceInfo writes, as an SR-IOV CNI plugin does, the device information of deviceID at
// path: type "pci", the device ID as the PCI address. It makes path's directory.
func WriteDeviceInfo(path, deviceID string) error {
	info := DeviceInfo{Type: "pci", Version: "1.1.0"}
	info.PCI.Address = deviceID
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("write device information: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write device information: %w", err)
	}
	return nil
}

// ParseConf decodes the network configuration CNI passes on stdin.
func ParseConf(data []byte) (*NetConf, error) {
	var conf NetConf
	if err := json.Unmarshal(data, &conf); err != nil {
		return nil, fmt.Errorf("decode network configuration: %w", err)
	}
	if conf.RecordFile == "" {
		return nil, errors.New("network configuration: recordFile is required")
	}
	return &conf, nil
}

// Pod identifies the pod a CNI call is for, as the kubelet's runtime passes it in CNI_ARGS.
type Pod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

// ParseArgs extracts the pod from CNI_ARGS ("K=V;K=V"). Keys it does not know are ignored, as
// containerd's IgnoreUnknown=1 asks.
func ParseArgs(cniArgs string) Pod {
	var pod Pod
	for _, kv := range strings.Split(cniArgs, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			pod.Namespace = v
		case "K8S_POD_NAME":
			pod.Name = v
		case "K8S_POD_UID":
			pod.UID = v
		}
	}
	return pod
}

// Entry is one line of the record file.
type Entry struct {
	// Time is when the plugin looked at the host's interfaces.
	Time time.Time `json:"time"`
	// Command is the CNI command: ADD or DEL.
	Command string `json:"command"`
	// ContainerID, Netns and IfName are CNI_CONTAINERID, CNI_NETNS and CNI_IFNAME.
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	// Pod is the pod from CNI_ARGS.
	Pod Pod `json:"pod"`
	// Interfaces maps each watched host interface name to whether it existed.
	Interfaces map[string]bool `json:"interfaces"`
	// Files are the host files matching watchFiles that existed, sorted.
	Files []string `json:"files,omitempty"`
	// DeviceID is the configuration's deviceID, empty when it had none.
	DeviceID string `json:"deviceID,omitempty"`
}

// HostInterfaces reports, for every name in watch, whether an interface of that name exists in
// the caller's network namespace, and adds every existing interface whose name starts with one
// of prefixes.
func HostInterfaces(watch, prefixes []string) (map[string]bool, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	seen := make(map[string]bool, len(watch))
	for _, name := range watch {
		seen[name] = false
	}
	for _, iface := range ifaces {
		if _, watched := seen[iface.Name]; watched || hasAnyPrefix(iface.Name, prefixes) {
			seen[iface.Name] = true
		}
	}
	return seen, nil
}

// HostFiles returns the paths that match any of patterns (filepath.Glob), sorted and without
// repeats. A malformed pattern is an error: a test must not silently watch nothing.
func HostFiles(patterns []string) ([]string, error) {
	var files []string
	for _, p := range patterns {
		m, err := filepath.Glob(p)
		if err != nil {
			return nil, fmt.Errorf("watch files %q: %w", p, err)
		}
		files = append(files, m...)
	}
	slices.Sort(files)
	return slices.Compact(files), nil
}

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// Append adds e as one line to the record file at path.
func Append(path string, e Entry) error { return AppendJSON(path, e) }

// AppendJSON adds v, as JSON, as one line to the file at path. containerd runs CNI for several
// pods at once, so the line is written under an exclusive lock, in one write to a file opened
// O_APPEND.
func AppendJSON(path string, v any) error {
	line, err := json.Marshal(v)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open record file: %w", err)
	}
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
	if err == nil {
		_, err = f.Write(append(line, '\n'))
	}
	// Closing the file releases the lock.
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("record to %s: %w", path, err)
	}
	return nil
}

// Read returns the entries of the record file at path, oldest first.
func Read(path string) ([]Entry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var entries []Entry
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return entries, fmt.Errorf("%s line %d: %w", path, len(entries)+1, err)
		}
		entries = append(entries, e)
	}
	return entries, sc.Err()
}

// Find returns the entries of one command (ADD or DEL) for the pod namespace/name, oldest first.
func Find(entries []Entry, command, namespace, name string) []Entry {
	var out []Entry
	for _, e := range entries {
		if e.Command == command && e.Pod.Namespace == namespace && e.Pod.Name == name {
			out = append(out, e)
		}
	}
	return out
}

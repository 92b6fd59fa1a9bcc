package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// statusTimeout bounds one PodSandboxStatus or ContainerStatus call: containerd answers from
// memory in milliseconds; more means it is stuck, and the kubelet may be waiting.
const statusTimeout = 10 * time.Second

// decodeInfo decodes the runtime's verbose status ("info", containerd's JSON) into v. what names
// the status in errors ("sandbox status", "container status"). This is the one parser of it.
func decodeInfo(what string, info map[string]string, v any) error {
	raw, ok := info["info"]
	if !ok {
		return fmt.Errorf("%s has no verbose info", what)
	}
	if err := json.Unmarshal([]byte(raw), v); err != nil {
		return fmt.Errorf("%s info: %w", what, err)
	}
	return nil
}

// containerInfo is the part of containerd's verbose container status ("info") podgate reads.
type containerInfo struct {
	RuntimeSpec *specs.Spec `json:"runtimeSpec"`
}

// ContainerCgroupsPath reads the container's linux.cgroupsPath from its runtime spec, in its
// verbose status. A runtime error keeps its class (NotFound: the container is gone).
func ContainerCgroupsPath(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) (string, error) {
	spec, err := containerSpec(ctx, rt, id)
	if err != nil {
		return "", err
	}
	return spec.Linux.CgroupsPath, nil
}

// containerSpec reads the container's runtime spec from its verbose status; it has a linux
// section with a cgroups path.
func containerSpec(ctx context.Context, rt runtimeapi.RuntimeServiceClient, id string) (*specs.Spec, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := rt.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("container status: %w", err)
	}
	var info containerInfo
	if err := decodeInfo("container status", st.GetInfo(), &info); err != nil {
		return nil, err
	}
	if info.RuntimeSpec == nil || info.RuntimeSpec.Linux == nil || info.RuntimeSpec.Linux.CgroupsPath == "" {
		return nil, errors.New("container's runtime spec has no linux.cgroupsPath")
	}
	return info.RuntimeSpec, nil
}

// sandboxInfo is the part of containerd's verbose sandbox status ("info") podgate reads.
type sandboxInfo struct {
	PID            int                          `json:"pid"`
	RuntimeHandler string                       `json:"runtimeHandler"`
	Config         *runtimeapi.PodSandboxConfig `json:"config"`
	RuntimeSpec    *specs.Spec                  `json:"runtimeSpec"`
}

// InspectSandbox reads the sandbox's verbose status, once, and fills in what the runtime
// knows of it: readiness, IPs, network namespace, pause PID, cgroup parent. What rec already
// holds from the pipeline (the pod, the runtime handler asked for) is kept.
func InspectSandbox(ctx context.Context, rt runtimeapi.RuntimeServiceClient, rec *SandboxRecord) error {
	_, err := inspectSandbox(ctx, rt, rec)
	return err
}

// inspectSandbox is InspectSandbox, returning also the sandbox's configuration as the runtime
// holds it (nil when its verbose status does not say).
func inspectSandbox(ctx context.Context, rt runtimeapi.RuntimeServiceClient, rec *SandboxRecord) (*runtimeapi.PodSandboxConfig, error) {
	ctx, cancel := context.WithTimeout(ctx, statusTimeout)
	defer cancel()
	st, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: rec.ID, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("sandbox status: %w", err)
	}
	s := st.GetStatus()
	rec.Ready = s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY
	rec.HostNetwork = s.GetLinux().GetNamespaces().GetOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
	rec.IPs = nil
	if ip := s.GetNetwork().GetIp(); ip != "" {
		rec.IPs = append(rec.IPs, ip)
	}
	for _, ip := range s.GetNetwork().GetAdditionalIps() {
		rec.IPs = append(rec.IPs, ip.GetIp())
	}
	var info sandboxInfo
	if err := decodeInfo("sandbox status", st.GetInfo(), &info); err != nil {
		return nil, err
	}
	rec.PID = info.PID
	if rec.RuntimeHandler == "" {
		rec.RuntimeHandler = info.RuntimeHandler
	}
	if rec.CgroupParent == "" {
		rec.CgroupParent = info.Config.GetLinux().GetCgroupParent()
	}
	rec.NetNS = ""
	if info.RuntimeSpec != nil && info.RuntimeSpec.Linux != nil {
		rec.CgroupsPath = info.RuntimeSpec.Linux.CgroupsPath
		for _, ns := range info.RuntimeSpec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace && ns.Path != "" {
				rec.NetNS = ns.Path
			}
		}
	}
	if rec.NetNS == "" && !rec.HostNetwork && info.PID > 0 {
		rec.NetNS = fmt.Sprintf("/proc/%d/ns/net", info.PID)
	}
	return info.Config, nil
}

// runtimeSandbox is a sandbox as the runtime reports it, with the configuration it holds for
// it (nil when its status could not be read); gone when it was removed before its status could
// be read.
type runtimeSandbox struct {
	SandboxRecord
	config *runtimeapi.PodSandboxConfig
	gone   bool
}

// recordFromRuntime makes the record of a sandbox podgate finds in the runtime without having
// seen it start, from ListPodSandbox's entry and its verbose status.
func recordFromRuntime(ctx context.Context, rt runtimeapi.RuntimeServiceClient, sb *runtimeapi.PodSandbox) runtimeSandbox {
	md := sb.GetMetadata()
	rec := SandboxRecord{
		ID:             sb.GetId(),
		Pod:            PodRef{UID: types.UID(md.GetUid()), Name: md.GetName(), Namespace: md.GetNamespace(), Attempt: md.GetAttempt()},
		RuntimeHandler: sb.GetRuntimeHandler(),
		Origin:         OriginAdopted,
		Ready:          sb.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY,
		CreatedAt:      time.Unix(0, sb.GetCreatedAt()).UTC(),
	}
	cfg, err := inspectSandbox(ctx, rt, &rec)
	if err != nil {
		if status.Code(err) == codes.NotFound {
			return runtimeSandbox{gone: true}
		}
		rec.Status = err.Error()
	}
	return runtimeSandbox{SandboxRecord: rec, config: cfg}
}

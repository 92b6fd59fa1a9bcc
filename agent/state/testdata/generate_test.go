package agent

// This file made the golden checkpoints beside it with podgate's code at e099f42, the last
// commit before the features kept their own records (the go tool ignores testdata: it does
// not build with today's code). To make them again, copy it into agent/ of a checkout of
// e099f42 and run there
//
//	GOLDEN_OUT=<this directory> go test -run TestGenerateGoldenCheckpoints ./agent
//
// Each file is what e099f42 writes: the data written with registry.Checkpoint.Write, loaded
// as openState loads it (every section registered), and written again. v2.json and v3.json
// read and written once more by e099f42 give the same bytes (checked below). v1.json is a v1
// file (e099f42 reads v1, never writes it: only its version line differs from what
// Checkpoint.Write makes of the same data) and v1-written.json what e099f42 writes after
// migrating it. v3-sandbox-key.json is v3.json with a key no podgate knows in two sandbox
// objects, as a later podgate could write it, added here after e099f42 wrote the file
// (e099f42 itself drops such a key when it writes).

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/podgate/podgate/cri/registry"
	"github.com/podgate/podgate/dra/attach"
	"github.com/podgate/podgate/dra/manager"
)

// goldenSandboxes are sandboxes of every sysctl verification result, two holding attached
// devices (every interface field set in one) when withAttached.
func goldenSandboxes(withAttached bool) []registry.SandboxRecord {
	at := func(s int) time.Time { return time.Date(2026, 11, 22, 3, 0, s, 0, time.UTC) }
	pod := func(uid string, attempt uint32) registry.PodRef {
		return registry.PodRef{UID: types.UID("uid-" + uid), Name: uid, Namespace: "ns", Attempt: attempt}
	}
	sbs := []registry.SandboxRecord{
		{ID: "sb-ok", Pod: pod("a", 0), RuntimeHandler: "runc", Origin: registry.OriginStarted, Ready: true, CreatedAt: at(0),
			NetNS: "/var/run/netns/cni-ok", PID: 4242, CgroupParent: "/kubepods/burstable/poduid-a", CgroupsPath: "/kubepods/burstable/poduid-a/sb-ok",
			IPs: []string{"10.88.0.7", "fd00::7"},
			Sysctls: registry.SysctlRecord{Asked: map[string]string{"net.ipv4.tcp_keepalive_time": "600"},
				Applied: map[string]string{"net.ipv4.tcp_keepalive_time": "600", "net.core.somaxconn": "1024"}, Verification: registry.SysctlsOK}},
		{ID: "sb-repaired", Pod: pod("b", 2), Origin: registry.OriginStarted, Ready: true, CreatedAt: at(1),
			NetNS: "/var/run/netns/cni-repaired", PID: 4243, CgroupParent: "kubepods-besteffort-poduid_b.slice",
			CgroupsPath: "kubepods-besteffort-poduid_b.slice:cri-containerd:sb-repaired", IPs: []string{"10.88.0.8"},
			Sysctls: registry.SysctlRecord{Asked: map[string]string{"net.core.somaxconn": "1024"}, Applied: map[string]string{"net.core.somaxconn": "1024"},
				Verification: registry.SysctlsRepaired, Mismatches: []string{`net.core.somaxconn="4096" (want "1024")`}}},
		{ID: "sb-mismatch", Pod: pod("c", 0), Origin: registry.OriginStarted, Ready: true, CreatedAt: at(2), NetNS: "/var/run/netns/cni-mismatch", PID: 4244,
			Sysctls: registry.SysctlRecord{Applied: map[string]string{"net.ipv4.ip_local_port_range": "1024 65000", "net.ipv4.tcp_syncookies": "1"},
				Verification: registry.SysctlsMismatch,
				Mismatches:   []string{`net.ipv4.ip_local_port_range="32768` + "\t" + `60999" (want "1024 65000")`, `net.ipv4.tcp_syncookies="0" (want "1")`}}},
		{ID: "sb-error", Pod: pod("d", 0), Origin: registry.OriginStarted, Ready: true, CreatedAt: at(3),
			Status: "sandbox status: rpc error: code = DeadlineExceeded desc = context deadline exceeded",
			Sysctls: registry.SysctlRecord{Applied: map[string]string{"kernel.shm_rmid_forced": "1"}, Verification: registry.SysctlsError,
				Error: "read kernel.shm_rmid_forced in <pid 0> & its netns: sandbox status info has no pid"}},
		{ID: "sb-pending", Pod: pod("e", 0), Origin: registry.OriginStarted, Ready: true, CreatedAt: at(4), NetNS: "/var/run/netns/cni-pending", PID: 4246,
			Sysctls: registry.SysctlRecord{Applied: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Verification: registry.SysctlsPending}},
		{ID: "sb-none", Pod: pod("f", 1), Origin: registry.OriginStarted, CreatedAt: at(5), HostNetwork: true, PID: 4247,
			Sysctls: registry.SysctlRecord{Verification: registry.SysctlsNone}},
		{ID: "sb-adopted", Pod: pod("g", 0), RuntimeHandler: "kata", Origin: registry.OriginAdopted, Ready: true, CreatedAt: at(6),
			NetNS: "/var/run/netns/cni-adopted", PID: 4248, CgroupParent: "/kubepods/poduid-g", CgroupsPath: "/kubepods/poduid-g/sb-adopted", IPs: []string{"10.88.0.12"},
			Sysctls: registry.SysctlRecord{Applied: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Verification: registry.SysctlsUnverified}},
	}
	if withAttached {
		sbs[0].Attached = []registry.AttachedDevice{
			{ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-net", Driver: "net.example.com", Pool: "pool-a", Device: "dev-0",
				Interface: registry.AttachedInterface{HostName: "eth5", PodName: "net1", MTU: 9000, Up: true, Alias: "uplink <a&b>",
					HardwareAddr: "02:00:00:00:00:05", Addresses: []string{"192.0.2.7/24", "2001:db8::7/64"}}, Published: true},
			{ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-net", Driver: "net.example.com", Pool: "pool-a", Device: "dev-2",
				Interface: registry.AttachedInterface{HostName: "eth7", PodName: "eth7"}},
		}
		sbs[1].Attached = []registry.AttachedDevice{
			{ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-net", Driver: "net.example.com", Pool: "pool-a", Device: "dev-3",
				Interface: registry.AttachedInterface{HostName: "veth3", PodName: "net1", MTU: 1500, Addresses: []string{"192.0.2.9/24"}}},
		}
	}
	return sbs
}

// goldenClaims are a claim podgate prepared (a network device, and one without network data),
// one the kubelet prepared, and one no pod uses any more, waiting for its unprepare.
func goldenClaims() ([]manager.ClaimInfo, []manager.PodDRA) {
	claims := []manager.ClaimInfo{
		{UID: "claim-gpu", Namespace: "ns", Name: "gpu", Drivers: []string{"gpu.example.com"}, Prepared: true,
			Devices:    []registry.DeviceRecord{{Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0", Requests: []string{"gpu"}, CDIDeviceIDs: []string{"gpu.example.com/gpu=gpu-0"}}},
			PreparedBy: manager.PreparedByKubelet, PodUIDs: []types.UID{"uid-c"}},
		{UID: "claim-net", Namespace: "ns", Name: "net", Drivers: []string{"net.example.com"}, Prepared: true,
			Devices: []registry.DeviceRecord{
				{Driver: "net.example.com", Pool: "pool-a", Device: "dev-0", Requests: []string{"nic"}, CDIDeviceIDs: []string{"net.example.com/nic=dev-0"},
					Network: &registry.DeviceNetworkRecord{HostInterface: "eth5", InterfaceName: "net1", MTU: 1400, Addresses: []string{"192.0.2.7/24", "2001:db8::7/64"}}},
				{Driver: "net.example.com", Pool: "pool-a", Device: "dev-1"},
			},
			PreparedBy: manager.PreparedByPodgate, PodUIDs: []types.UID{"uid-a", "uid-b"}},
		{UID: "claim-old", Namespace: "ns", Name: "old", Drivers: []string{"net.example.com"}, Prepared: true, PreparedBy: manager.PreparedByPodgate},
	}
	pods := []manager.PodDRA{
		{Pod: registry.PodRef{UID: "uid-a", Name: "a", Namespace: "ns"}, Claims: []manager.PodClaimRef{{UID: "claim-net", PodClaimName: "net"}},
			Containers: []registry.ContainerClaims{{Name: "app", Claims: []string{"net"}}, {Name: "side"}}},
		{Pod: registry.PodRef{UID: "uid-b", Name: "b", Namespace: "ns", Attempt: 2}, Claims: []manager.PodClaimRef{{UID: "claim-net", PodClaimName: "nic"}}},
		{Pod: registry.PodRef{UID: "uid-c", Name: "c", Namespace: "ns"}, Claims: []manager.PodClaimRef{{UID: "claim-gpu", PodClaimName: "gpu"}},
			Containers: []registry.ContainerClaims{{Name: "train", Claims: []string{"gpu"}}}},
	}
	return claims, pods
}

// goldenIntents are an attach under way in a sandbox that runs, and one a crash left for a
// sandbox that is gone.
func goldenIntents() []attach.Intent {
	return []attach.Intent{
		{SandboxID: "sb-gone", Pod: registry.PodRef{UID: "uid-h", Name: "h", Namespace: "ns"}, NetNS: "/var/run/netns/cni-gone",
			ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-net", Driver: "net.example.com", Pool: "pool-a", Device: "dev-4",
			HostInterface: "eth9", Config: attach.InterfaceConfig{}},
		{SandboxID: "sb-pending", Pod: registry.PodRef{UID: "uid-e", Name: "e", Namespace: "ns"}, NetNS: "/var/run/netns/cni-pending",
			ClaimNamespace: "ns", ClaimName: "net", ClaimUID: "claim-net", Driver: "net.example.com", Pool: "pool-a", Device: "dev-1",
			HostInterface: "eth6", Config: attach.InterfaceConfig{Name: "net2", MTU: 1400, Addresses: []string{"192.0.2.8/24", "2001:db8::8/64"}}},
	}
}

// future is a top-level key no podgate knows, as a later one could write it.
var future = json.RawMessage(`{"from":"a later podgate","n":[1,2,3]}`)

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeAndReload writes d with e099f42's writer into a fresh state directory, loads it as
// podgate's start-up does and writes it again; it returns the bytes of that second write.
func writeAndReload(t *testing.T, d registry.CheckpointData, version string) []byte {
	t.Helper()
	dir := t.TempDir()
	cp := registry.NewCheckpoint(dir)
	if err := cp.Write(d); err != nil {
		t.Fatal(err)
	}
	if version != "" {
		b, err := os.ReadFile(cp.Path())
		if err != nil {
			t.Fatal(err)
		}
		b = bytes.Replace(b, []byte(`"version":"podgate.dev/registry/v2"`), []byte(`"version":"`+version+`"`), 1)
		if err := os.WriteFile(cp.Path(), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return rewrite(t, dir)
}

// rewrite loads the checkpoint in dir as podgate's start-up does and writes it again.
func rewrite(t *testing.T, dir string) []byte {
	t.Helper()
	reg, _, _ := restartState(t, dir)
	reg.PersistSoon()
	reg.Flush()
	b, err := os.ReadFile(registry.NewCheckpoint(dir).Path())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stable checks that e099f42 writes file back unchanged, and saves it as name.
func stable(t *testing.T, out, name string, file []byte) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, registry.CheckpointFile), file, 0o600); err != nil {
		t.Fatal(err)
	}
	if again := rewrite(t, dir); !bytes.Equal(again, file) {
		t.Fatalf("%s: e099f42 writes it back as\n%s\nnot\n%s", name, again, file)
	}
	save(t, out, name, file)
}

func save(t *testing.T, out, name string, file []byte) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(out, name), file, 0o644); err != nil {
		t.Fatal(err)
	}
}

// withSandboxKeys adds to the sandbox objects of file (a checkpoint e099f42 wrote of
// sandboxes) the keys extra holds for them, each last in its object, and seals the data again.
func withSandboxKeys(t *testing.T, file []byte, sandboxes []registry.SandboxRecord, extra map[string]string) []byte {
	t.Helper()
	var f struct {
		Version  string          `json:"version"`
		Checksum string          `json:"checksum"`
		Data     json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(file, &f); err != nil {
		t.Fatal(err)
	}
	head := []byte(`{"sandboxes":`)
	list := mustJSON(t, sandboxes)
	if !bytes.HasPrefix(f.Data, append(head, list...)) {
		t.Fatalf("data does not begin with the sandboxes: %s", f.Data)
	}
	rest := f.Data[len(head)+len(list):]
	var data bytes.Buffer
	data.Write(head)
	data.WriteByte('[')
	for i := range sandboxes {
		if i > 0 {
			data.WriteByte(',')
		}
		obj := mustJSON(t, sandboxes[i])
		if kv, ok := extra[sandboxes[i].ID]; ok {
			obj = append(append(obj[:len(obj)-1], ","+kv...), '}')
		}
		data.Write(obj)
	}
	data.WriteByte(']')
	data.Write(rest)
	sum := sha256.Sum256(data.Bytes())
	f.Data, f.Checksum = data.Bytes(), "sha256:"+hex.EncodeToString(sum[:])
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(f); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestGenerateGoldenCheckpoints(t *testing.T) {
	out := os.Getenv("GOLDEN_OUT")
	if out == "" {
		t.Skip("GOLDEN_OUT not set")
	}
	claims, pods := goldenClaims()
	sections := func(withIntents bool) map[string]json.RawMessage {
		s := map[string]json.RawMessage{"claims": mustJSON(t, claims), "draPods": mustJSON(t, pods), "future": future}
		if withIntents {
			s["attaching"] = mustJSON(t, goldenIntents())
		}
		return s
	}

	v2 := writeAndReload(t, registry.CheckpointData{Sandboxes: goldenSandboxes(true), Sections: sections(false), Version: 2}, "")
	stable(t, out, "v2.json", v2)
	v3 := writeAndReload(t, registry.CheckpointData{Sandboxes: goldenSandboxes(true), Sections: sections(true), Version: 3}, "")
	stable(t, out, "v3.json", v3)
	save(t, out, "v3-sandbox-key.json", withSandboxKeys(t, v3, goldenSandboxes(true), map[string]string{
		"sb-ok":   `"zNext":{"since":"a later podgate","n":[1,2]}`,
		"sb-none": `"qos":"guaranteed"`,
	}))

	// v1: a copy of each claim in every pod using it, the claims' shared state differing
	// between the copies (one pod's copy prepared, the other's not yet).
	podClaims := []registry.PodClaims{
		{Pod: registry.PodRef{UID: "uid-a", Name: "a", Namespace: "ns"},
			Claims: []registry.ClaimRecord{{UID: "claim-net", Namespace: "ns", Name: "net", PodClaimName: "net", Drivers: []string{"net.example.com"}, Prepared: true,
				Devices: claims[1].Devices}},
			Containers: []registry.ContainerClaims{{Name: "app", Claims: []string{"net"}}, {Name: "side"}}},
		{Pod: registry.PodRef{UID: "uid-b", Name: "b", Namespace: "ns", Attempt: 2},
			Claims: []registry.ClaimRecord{{UID: "claim-net", Namespace: "ns", Name: "net", PodClaimName: "nic", Drivers: []string{"net.example.com"}}}},
	}
	d1 := registry.CheckpointData{Sandboxes: goldenSandboxes(false), Sections: map[string]json.RawMessage{"podClaims": mustJSON(t, podClaims), "future": future}}
	dir := t.TempDir()
	cp := registry.NewCheckpoint(dir)
	if err := cp.Write(d1); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(cp.Path())
	if err != nil {
		t.Fatal(err)
	}
	v1 := bytes.Replace(b, []byte(`"version":"podgate.dev/registry/v2"`), []byte(`"version":"podgate.dev/registry/v1"`), 1)
	save(t, out, "v1.json", v1)
	if err := os.WriteFile(cp.Path(), v1, 0o600); err != nil {
		t.Fatal(err)
	}
	written := rewrite(t, dir)
	stable(t, out, "v1-written.json", written)
}

package sysctl

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"

	"github.com/podgate/podgate/cri/pipeline"
	"github.com/podgate/podgate/cri/registry"
)

func sandbox(id string) registry.SandboxRecord {
	return registry.SandboxRecord{ID: id, Pod: registry.PodRef{UID: types.UID("uid-" + id), Name: id, Namespace: "ns"},
		Origin: registry.OriginStarted, Ready: true, CreatedAt: time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)}
}

func newRecords(t *testing.T, reg *registry.Registry) *Records {
	t.Helper()
	r, err := NewRecords(reg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestRecordsInTheCheckpoint: each sandbox's record is the sysctls key of its sandbox object,
// read back as written; a sandbox without a record has the empty one, as podgate always wrote
// it; a record that does not decode names the checkpoint as damaged.
func TestRecordsInTheCheckpoint(t *testing.T) {
	cp := registry.NewCheckpoint(t.TempDir())
	reg := registry.NewRegistry(cp, registry.CheckpointData{Sandboxes: []registry.SandboxRecord{sandbox("a"), sandbox("b")}})
	r := newRecords(t, reg)
	want := Record{Asked: map[string]string{"net.core.somaxconn": "1024"}, Applied: map[string]string{"net.core.somaxconn": "1024"},
		Verification: ResultRepaired, Mismatches: []string{`net.core.somaxconn="4096" (want "1024")`}}
	r.set("a", want)
	reg.PersistSoon()
	reg.Flush()
	d, err := cp.ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if got := string(d.SandboxFields["b"]["sysctls"]); got != `{"verification":""}` {
		t.Errorf("sandbox without a record written as %s, want the empty record", got)
	}
	restarted := newRecords(t, registry.NewRegistry(cp, d))
	if got, ok := restarted.Sandbox("a"); !ok || !cmp.Equal(got, want) {
		t.Errorf("read back %+v (%t), want %+v", got, ok, want)
	}

	d.SandboxFields["a"]["sysctls"] = json.RawMessage(`["not a record"]`)
	if _, err := NewRecords(registry.NewRegistry(cp, d)); err == nil {
		t.Error("a record that does not decode was taken up")
	}
}

// TestRecordsOfAdoptedSandboxes: a sandbox the rebuild adopts has the sysctls its runtime
// configuration holds, unverified, unless the stages recorded it already; a sandbox that goes
// takes its record with it.
func TestRecordsOfAdoptedSandboxes(t *testing.T) {
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	r := newRecords(t, reg)
	rec := sandbox("a")
	r.SandboxAdopted(&rec, &runtimeapi.PodSandboxConfig{Linux: &runtimeapi.LinuxPodSandboxConfig{Sysctls: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}}})
	if got, _ := r.Sandbox("a"); got.Verification != ResultUnverified || got.Applied["net.ipv4.tcp_keepalive_time"] != "600" || got.Asked != nil {
		t.Errorf("adopted sandbox's record %+v, want the runtime's sysctls applied, unverified", got)
	}
	started := sandbox("b")
	r.set("b", Record{Verification: ResultOK})
	r.SandboxAdopted(&started, nil)
	if got, _ := r.Sandbox("b"); got.Verification != ResultOK {
		t.Errorf("a record the stages made was replaced on adoption: %+v", got)
	}
	noStatus := sandbox("c")
	r.SandboxAdopted(&noStatus, nil)
	if got, _ := r.Sandbox("c"); got.Verification != ResultUnverified || got.Applied != nil {
		t.Errorf("sandbox adopted without its status: %+v, want unverified, nothing applied", got)
	}
	r.SandboxGone(&rec)
	if _, ok := r.Sandbox("a"); ok {
		t.Error("the record of a sandbox gone is still there")
	}
}

// TestRecordChangesToldWithThePod: the verification's result, recorded after RunPodSandbox
// answered, is a change of the sandbox's pod, told with the record before and after (what the
// PodResources watch sends); a sandbox gone meanwhile is not recorded again.
func TestRecordChangesToldWithThePod(t *testing.T) {
	reg := registry.NewRegistry(nil, registry.CheckpointData{})
	r := newRecords(t, reg)
	r.set("a", Record{Applied: map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, Verification: ResultPending})
	var mu sync.Mutex
	var told [][2]string
	reg.OnPodChange(func(_ uint64, before, after *registry.PodState) {
		mu.Lock()
		defer mu.Unlock()
		verification := func(st *registry.PodState) string {
			if st == nil {
				return "-"
			}
			return InPod(st)["a"].Verification
		}
		told = append(told, [2]string{verification(before), verification(after)})
	})
	if err := reg.Add(sandbox("a")); err != nil {
		t.Fatal(err)
	}
	r.update("a", func(rec *Record) { rec.Verification = ResultOK })
	reg.Remove("a")
	r.update("a", func(rec *Record) { rec.Verification = ResultError })
	want := [][2]string{{"-", ResultPending}, {ResultPending, ResultOK}, {ResultOK, "-"}}
	if d := cmp.Diff(want, told); d != "" {
		t.Errorf("changes told (before, after) (-want +got):\n%s", d)
	}
	if _, ok := r.Sandbox("a"); ok {
		t.Error("a record came back for the sandbox gone")
	}
}

// TestVerifyStageRecords: the verification stage records the sandbox's sysctls as the check
// made them (none: nothing to verify), shown once the registry records the sandbox; its undo
// forgets them; a verification that fails the sandbox (verify: fail) records nothing.
func TestVerifyStageRecords(t *testing.T) {
	ctx := klog.NewContext(context.Background(), klog.Background())
	for _, tc := range []struct {
		name    string
		mode    VerifyMode
		sysctls map[string]string
		want    string // the verification recorded; "" for nothing
	}{
		{"none", VerifyWarn, nil, ResultNone},
		{"background", VerifyWarn, map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, ResultPending},
		{"fail without the sandbox's namespaces", VerifyFail, map[string]string{"net.ipv4.tcp_keepalive_time": "600"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRecords(t, registry.NewRegistry(nil, registry.CheckpointData{}))
			policy, err := NewPolicy(Config{}, modern, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			g := NewStages(policy, tc.mode, r, prometheus.NewRegistry())
			req := &runtimeapi.RunPodSandboxRequest{Config: &runtimeapi.PodSandboxConfig{
				Metadata: &runtimeapi.PodSandboxMetadata{Name: "p", Namespace: "ns", Uid: "uid-p"},
				Linux:    &runtimeapi.LinuxPodSandboxConfig{Sysctls: tc.sysctls},
			}}
			sb := pipeline.NewSandbox(ctx, req, nil)
			defer sb.End()
			if err := g.check(ctx, sb); err != nil {
				t.Fatal(err)
			}
			sb.Rec.ID = "sb-" + tc.name
			err = g.verifyRun(ctx, sb)
			got, ok := r.Sandbox(sb.Rec.ID)
			switch {
			case tc.want == "" && (err == nil || ok):
				t.Errorf("verification: %v, record %+v (%t); want its failure, nothing recorded", err, got, ok)
			case tc.want != "" && (err != nil || got.Verification != tc.want):
				t.Errorf("verification: %v, record %+v; want %s", err, got, tc.want)
			}
			if err := g.VerifyStage().Undo(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if _, ok := r.Sandbox(sb.Rec.ID); ok {
				t.Error("the record stayed after the stage's undo")
			}
		})
	}
}

package attach

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/podgate/podgate/dra"
)

// TestRecordsMirrorDRA holds the registry's copies to the dra types they mirror: the same
// values make the same JSON (the checkpoint keeps its form), and converting loses nothing.
func TestRecordsMirrorDRA(t *testing.T) {
	a := dra.Attached{HostName: "eth5", PodName: "net1", MTU: 9000, Up: true, Alias: "podgate", HardwareAddr: "02:00:00:00:00:01", Addresses: []string{"192.0.2.10/24"}}
	cfg := dra.InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24", "2001:db8::1/64"}}
	for name, pair := range map[string][2]any{
		"Attached":        {a, attachedRecord(a)},
		"InterfaceConfig": {cfg, configRecord(cfg)},
	} {
		want, err := json.Marshal(pair[0])
		if err != nil {
			t.Fatal(err)
		}
		got, err := json.Marshal(pair[1])
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s: registry's JSON %s, dra's %s", name, got, want)
		}
	}
	if d := cmp.Diff(a, attached(attachedRecord(a))); d != "" {
		t.Errorf("Attached round trip (-want +got):\n%s", d)
	}
	if d := cmp.Diff(cfg, interfaceConfig(configRecord(cfg))); d != "" {
		t.Errorf("InterfaceConfig round trip (-want +got):\n%s", d)
	}
}

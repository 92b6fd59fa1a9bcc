package dra

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const netDriver = "net.example.com"

// opaque is a claim's configuration for driver, for requests, with parameters params.
func opaque(driver, params string, requests ...string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func configClaim(configs ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nic"},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Config: configs}},
	}
}

func TestInterfaceConfigFor(t *testing.T) {
	result := resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: netDriver, Pool: "node-a", Device: "eth5"}
	tests := []struct {
		name    string
		claim   *resourceapi.ResourceClaim
		result  *resourceapi.DeviceRequestAllocationResult
		want    InterfaceConfig
		wantOK  bool
		wantErr string // part of the message of an ErrInvalidArgument
	}{
		{
			name:  "no config",
			claim: configClaim(),
		},
		{
			name:   "all fields",
			claim:  configClaim(opaque(netDriver, `{"interface": {"name": "net1", "mtu": 1400, "addresses": ["192.0.2.10/24", "2001:DB8::10/64"]}}`)),
			want:   InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24", "2001:db8::10/64"}},
			wantOK: true,
		},
		{
			name:   "the driver's own fields are ignored",
			claim:  configClaim(opaque(netDriver, `{"apiVersion": "v1", "kind": "NetConfig", "routes": [{"to": "0.0.0.0/0"}], "interface": {"name": "net1", "hardwareAddr": "x"}}`)),
			want:   InterfaceConfig{Name: "net1"},
			wantOK: true,
		},
		{
			name:  "only the driver's parameters",
			claim: configClaim(opaque(netDriver, `{"vlan": 7}`)),
		},
		{
			name:  "another driver",
			claim: configClaim(opaque("gpu.example.com", `{"interface": {"name": "net1"}}`)),
		},
		{
			name:  "another request",
			claim: configClaim(opaque(netDriver, `{"interface": {"name": "net1"}}`, "other")),
		},
		{
			name:   "the request named",
			claim:  configClaim(opaque(netDriver, `{"interface": {"name": "net1"}}`, "other", "nic")),
			want:   InterfaceConfig{Name: "net1"},
			wantOK: true,
		},
		{
			name:   "a subrequest's parent named",
			claim:  configClaim(opaque(netDriver, `{"interface": {"name": "net1"}}`, "nic")),
			result: &resourceapi.DeviceRequestAllocationResult{Request: "nic/fast", Driver: netDriver, Pool: "node-a", Device: "eth5"},
			want:   InterfaceConfig{Name: "net1"},
			wantOK: true,
		},
		{
			name: "later entries win field by field",
			claim: configClaim(
				opaque(netDriver, `{"interface": {"name": "net1", "mtu": 9000, "addresses": ["192.0.2.1/24"]}}`),
				opaque(netDriver, `{"interface": {"name": "net2", "addresses": ["192.0.2.2/24"]}}`, "nic"),
				opaque(netDriver, `{"interface": {"mtu": 1400}}`, "other"),
			),
			want:   InterfaceConfig{Name: "net2", MTU: 9000, Addresses: []string{"192.0.2.2/24"}},
			wantOK: true,
		},
		{
			name: "the allocation's configs, class first",
			claim: func() *resourceapi.ResourceClaim {
				c := configClaim(opaque(netDriver, `{"interface": {"name": "ignored"}}`))
				c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Config: []resourceapi.DeviceAllocationConfiguration{
					{Source: resourceapi.AllocationConfigSourceClass, Requests: []string{"nic"}, DeviceConfiguration: opaque(netDriver, `{"interface": {"name": "class0", "mtu": 9000}}`).DeviceConfiguration},
					{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: opaque(netDriver, `{"interface": {"name": "net1"}}`).DeviceConfiguration},
				}}}
				return c
			}(),
			want:   InterfaceConfig{Name: "net1", MTU: 9000},
			wantOK: true,
		},
		{
			name:   "empty addresses clear earlier ones",
			claim:  configClaim(opaque(netDriver, `{"interface": {"addresses": ["192.0.2.1/24"]}}`), opaque(netDriver, `{"interface": {"addresses": []}}`)),
			want:   InterfaceConfig{Addresses: []string{}},
			wantOK: true,
		},
		{name: "not JSON", claim: configClaim(opaque(netDriver, `{"interface": `)), wantErr: "spec.devices.config[0].opaque.parameters: not podgate's interface configuration"},
		{name: "wrong type", claim: configClaim(opaque(netDriver, `{"interface": {"mtu": "1400"}}`)), wantErr: "not podgate's interface configuration"},
		{name: "name empty", claim: configClaim(opaque(netDriver, `{"interface": {"name": ""}}`)), wantErr: `interface.name "": must not be empty`},
		{name: "name too long", claim: configClaim(opaque(netDriver, `{"interface": {"name": "sixteen-bytes-xx"}}`)), wantErr: "longer than 15 bytes"},
		{name: "name lo", claim: configClaim(opaque(netDriver, `{"interface": {"name": "lo"}}`)), wantErr: "loopback"},
		{name: "name with slash", claim: configClaim(opaque(netDriver, `{"interface": {"name": "a/b"}}`)), wantErr: "printable ASCII"},
		{name: "name with space", claim: configClaim(opaque(netDriver, `{"interface": {"name": "a b"}}`)), wantErr: "printable ASCII"},
		{name: "name pattern", claim: configClaim(opaque(netDriver, `{"interface": {"name": "net%d"}}`)), wantErr: "printable ASCII"},
		{name: "name dot", claim: configClaim(opaque(netDriver, `{"interface": {"name": ".."}}`)), wantErr: "not an interface name"},
		{name: "MTU too small", claim: configClaim(opaque(netDriver, `{"interface": {"mtu": 67}}`)), wantErr: "interface.mtu: 67: must be between 68 and 65535"},
		{name: "MTU too large", claim: configClaim(opaque(netDriver, `{"interface": {"mtu": 65536}}`)), wantErr: "interface.mtu: 65536"},
		{name: "MTU zero", claim: configClaim(opaque(netDriver, `{"interface": {"mtu": 0}}`)), wantErr: "interface.mtu: 0"},
		{name: "address without prefix", claim: configClaim(opaque(netDriver, `{"interface": {"addresses": ["192.0.2.10"]}}`)), wantErr: `interface.addresses: "192.0.2.10": not an address in CIDR notation`},
		{name: "address twice", claim: configClaim(opaque(netDriver, `{"interface": {"addresses": ["2001:db8::1/64", "2001:DB8::1/64"]}}`)), wantErr: "listed twice"},
		{name: "multicast address", claim: configClaim(opaque(netDriver, `{"interface": {"addresses": ["224.0.0.1/24"]}}`)), wantErr: "not a unicast"},
		{name: "too many addresses", claim: configClaim(opaque(netDriver, `{"interface": {"addresses": [`+strings.Repeat(`"192.0.2.1/32",`, 16)+`"192.0.2.1/32"]}}`)), wantErr: "17 addresses, at most 16"},
		{
			name:    "an invalid entry that does not apply",
			claim:   configClaim(opaque(netDriver, `{"interface": {"mtu": 1}}`, "other"), opaque(netDriver, `{"interface": {"mtu": 1500}}`)),
			want:    InterfaceConfig{MTU: 1500},
			wantOK:  true,
			wantErr: "",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := result
			if tc.result != nil {
				r = *tc.result
			}
			got, ok, err := InterfaceConfigFor(tc.claim, r)
			if tc.wantErr != "" {
				if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "claim ns/nic ") {
					t.Fatalf("InterfaceConfigFor: %v; want an invalid argument naming claim ns/nic and containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || ok != tc.wantOK || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("InterfaceConfigFor = %+v, %t, %v; want %+v, %t, nil", got, ok, err, tc.want, tc.wantOK)
			}
		})
	}
}

func TestInterfaceConfigValidate(t *testing.T) {
	tests := []struct {
		cfg   InterfaceConfig
		valid bool
	}{
		{InterfaceConfig{}, true},
		{InterfaceConfig{Name: "net1", MTU: 9000, Addresses: []string{"192.0.2.1/24"}}, true},
		{InterfaceConfig{Name: "lo"}, false},
		{InterfaceConfig{MTU: 10}, false},
		{InterfaceConfig{Addresses: []string{"nonsense"}}, false},
	}
	for _, tc := range tests {
		if err := tc.cfg.validate(); (err == nil) != tc.valid {
			t.Errorf("validate(%+v) = %v, want valid %t", tc.cfg, err, tc.valid)
		}
	}
}

func TestInterfaceConfigDeviceNetwork(t *testing.T) {
	a := Attached{HostName: "eth5", PodName: "net1", HardwareAddr: "02:00:00:00:00:01", Addresses: []string{"192.0.2.10/24"}}
	result := resourceapi.DeviceRequestAllocationResult{Driver: netDriver, Pool: "node-a", Device: "eth5", ShareID: ptr.To(types.UID("share-1"))}
	want := DeviceNetwork{Driver: netDriver, Pool: "node-a", Device: "eth5", ShareID: "share-1",
		InterfaceName: "net1", IPs: []string{"192.0.2.10/24"}, HardwareAddress: "02:00:00:00:00:01"}
	if got := a.DeviceNetwork(result); !reflect.DeepEqual(got, want) {
		t.Errorf("DeviceNetwork = %+v, want %+v", got, want)
	}
}

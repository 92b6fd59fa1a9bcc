package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2/ktesting"

	"github.com/podgate/podgate/test/testnet"
)

// The tests below create network namespaces with `ip netns add`: one stands for the host, one
// for the pod. They touch no other namespace, and podgate's code reaches both through netlink
// handles, so no thread of the test process enters them for longer than a socket's creation.

// testNetns creates a network namespace, deleted when the test ends, and returns its path.
func testNetns(t *testing.T) string {
	_, path := testnet.Named(t, "pgtest")
	return path
}

// inNetns runs ip with args in the namespace at path.
func inNetns(t *testing.T, path string, args ...string) {
	t.Helper()
	testnet.IP(t, append([]string{"-n", filepath.Base(path)}, args...)...)
}

// handleAt returns a netlink handle in the namespace at path.
func handleAt(t *testing.T, path string) *netlink.Handle {
	t.Helper()
	return testnet.HandleAt(t, path)
}

// linkState is what the tests compare of an interface.
type linkState struct {
	Name  string
	MTU   int
	Up    bool
	Alias string
	Addrs []string // global addresses, sorted
}

// stateOf returns the state of the interface name in h's namespace; ok is false when there is
// none.
func stateOf(t *testing.T, h *netlink.Handle, name string) (linkState, bool) {
	t.Helper()
	link, err := h.LinkByName(name)
	if isLinkNotFound(err) {
		return linkState{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	s := linkState{Name: name, MTU: link.Attrs().MTU, Up: link.Attrs().Flags&net.FlagUp != 0, Alias: link.Attrs().Alias}
	for _, a := range addrs {
		if !a.IP.IsLinkLocalUnicast() {
			s.Addrs = append(s.Addrs, a.IPNet.String())
		}
	}
	slices.Sort(s.Addrs)
	return s, true
}

// hostLink makes a veth pair in the host namespace, name and name+"p", with an alias; up says
// whether name is up.
func hostLink(t *testing.T, host, name string, up bool) linkState {
	t.Helper()
	inNetns(t, host, "link", "add", name, "mtu", "1500", "type", "veth", "peer", "name", name+"p")
	inNetns(t, host, "link", "set", name, "alias", "uplink to rack 7")
	want := linkState{Name: name, MTU: 1500, Alias: "uplink to rack 7"}
	if up {
		inNetns(t, host, "link", "set", name, "up")
		want.Up = true
	}
	return want
}

// checkThreadsHome fails the test, when it and its subtests are done, if a thread of the test
// process is then in another network namespace than the process. (While parallel subtests
// run, a locked thread may be in a test namespace for the creation of a netlink socket.)
func checkThreadsHome(t *testing.T) {
	t.Cleanup(func() { threadsHome(t) })
}

func threadsHome(t *testing.T) {
	home, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		ns, err := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/net"))
		if err == nil && ns != home {
			t.Errorf("thread %s is in network namespace %s, the process in %s", task.Name(), ns, home)
		}
	}
}

func TestAttachDetach(t *testing.T) {
	testnet.RequireNetAdmin(t)
	checkThreadsHome(t)
	tests := []struct {
		name     string
		cfg      InterfaceConfig
		hostUp   bool
		podTaken bool // the pod has an interface named like the host's
		wantPod  linkState
	}{
		{
			name:    "rename, MTU and addresses",
			cfg:     InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24", "2001:db8::10/64"}},
			wantPod: linkState{Name: "net1", MTU: 1400, Up: true, Addrs: []string{"192.0.2.10/24", "2001:db8::10/64"}},
		},
		{
			name:    "keep the host's name and MTU",
			cfg:     InterfaceConfig{},
			wantPod: linkState{Name: "pgeth0", MTU: 1500, Up: true},
		},
		{
			name:    "host interface up",
			cfg:     InterfaceConfig{Name: "net1"},
			hostUp:  true,
			wantPod: linkState{Name: "net1", MTU: 1500, Up: true},
		},
		{
			name:     "host name taken in the pod",
			cfg:      InterfaceConfig{Name: "net1", Addresses: []string{"198.51.100.7/32"}},
			podTaken: true,
			wantPod:  linkState{Name: "net1", MTU: 1500, Up: true, Addrs: []string{"198.51.100.7/32"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			host, pod := testNetns(t), testNetns(t)
			wantHost := hostLink(t, host, "pgeth0", tc.hostUp)
			if tc.podTaken {
				inNetns(t, pod, "link", "add", "pgeth0", "type", "veth", "peer", "name", "pgeth0p")
			}
			hostH, podH := handleAt(t, host), handleAt(t, pod)
			m := linkMover{hostNetns: host}

			a, err := m.attach(ctx, "pgeth0", pod, tc.cfg)
			if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			wantPod := tc.wantPod
			wantPod.Alias = markOf(Attached{HostName: "pgeth0", MTU: 1500, Up: tc.hostUp, Alias: wantHost.Alias}).alias()
			if got, _ := stateOf(t, podH, wantPod.Name); !equalState(got, wantPod) {
				t.Errorf("in the pod: %+v, want %+v", got, wantPod)
			}
			if _, ok := stateOf(t, hostH, "pgeth0"); ok {
				t.Error("pgeth0 still on the host")
			}
			wantA := Attached{HostName: "pgeth0", PodName: wantPod.Name, MTU: 1500, Up: tc.hostUp, Alias: wantHost.Alias, Addresses: tc.cfg.Addresses}
			wantA.HardwareAddr = a.HardwareAddr
			if _, err := net.ParseMAC(a.HardwareAddr); err != nil || !equalAttached(a, wantA) {
				t.Errorf("Attach = %+v, want %+v with a MAC", a, wantA)
			}

			again, err := m.attach(ctx, "pgeth0", pod, tc.cfg)
			if err != nil || !equalAttached(again, a) {
				t.Errorf("Attach again = %+v, %v; want %+v, nil", again, err, a)
			}

			// The checkpoint keeps a as JSON.
			var restored Attached
			if b, err := json.Marshal(a); err != nil || json.Unmarshal(b, &restored) != nil {
				t.Fatalf("JSON round trip of %+v: %v", a, err)
			}
			for i := range 2 {
				if err := m.detach(ctx, restored, pod); err != nil {
					t.Fatalf("Detach %d: %v", i+1, err)
				}
				if got, ok := stateOf(t, hostH, "pgeth0"); !ok || !equalState(got, wantHost) {
					t.Errorf("on the host after Detach %d: %+v (found %t), want %+v", i+1, got, ok, wantHost)
				}
				if got, ok := stateOf(t, podH, wantPod.Name); ok {
					t.Errorf("still in the pod after Detach %d: %+v", i+1, got)
				}
			}
		})
	}
}

func TestAttachFailureLeavesHostUnchanged(t *testing.T) {
	testnet.RequireNetAdmin(t)
	checkThreadsHome(t)
	tests := []struct {
		name     string
		hostIf   string
		cfg      InterfaceConfig
		setupPod func(t *testing.T, pod string)
		podPath  func(host, pod string) string
		class    error
	}{
		{
			name:   "name taken in the pod",
			hostIf: "pgeth0",
			cfg:    InterfaceConfig{Name: "net1"},
			setupPod: func(t *testing.T, pod string) {
				inNetns(t, pod, "link", "add", "net1", "type", "veth", "peer", "name", "net1p")
			},
			class: errdefs.ErrAlreadyExists,
		},
		{
			// The kernel refuses the address after the move, rename and MTU.
			name:   "address refused in the pod",
			hostIf: "pgeth0",
			cfg:    InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24", "2001:db8::10/64"}},
			setupPod: func(t *testing.T, pod string) {
				cmd := exec.Command("ip", "netns", "exec", filepath.Base(pod), "sysctl", "-qw",
					"net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("disable IPv6 in the pod: %v: %s", err, out)
				}
			},
		},
		{
			name:   "no such host interface",
			hostIf: "pgnone0",
			class:  errdefs.ErrFailedPrecondition,
		},
		{
			name:    "no such pod namespace",
			hostIf:  "pgeth0",
			podPath: func(_, pod string) string { return pod + "-gone" },
			class:   errdefs.ErrFailedPrecondition,
		},
		{
			name:    "pod namespace is the host's",
			hostIf:  "pgeth0",
			podPath: func(host, _ string) string { return host },
			class:   errdefs.ErrInvalidArgument,
		},
		{
			name:   "invalid name",
			hostIf: "pgeth0",
			cfg:    InterfaceConfig{Name: "lo"},
			class:  errdefs.ErrInvalidArgument,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			host, pod := testNetns(t), testNetns(t)
			wantHost := hostLink(t, host, "pgeth0", true)
			if tc.setupPod != nil {
				tc.setupPod(t, pod)
			}
			podPath := pod
			if tc.podPath != nil {
				podPath = tc.podPath(host, pod)
			}
			hostH, podH := handleAt(t, host), handleAt(t, pod)
			linksBefore := linkNames(t, podH)

			_, err := linkMover{hostNetns: host}.attach(ctx, tc.hostIf, podPath, tc.cfg)
			if err == nil {
				t.Fatal("Attach succeeded")
			}
			if tc.class != nil && !errors.Is(err, tc.class) {
				t.Errorf("Attach: %v, want class %v", err, tc.class)
			}
			t.Logf("Attach: %v", err)
			if got, ok := stateOf(t, hostH, "pgeth0"); !ok || !equalState(got, wantHost) {
				t.Errorf("on the host: %+v (found %t), want %+v", got, ok, wantHost)
			}
			if got := linkNames(t, podH); !slices.Equal(got, linksBefore) {
				t.Errorf("pod interfaces %v, before %v", got, linksBefore)
			}
		})
	}
}

// TestAttachResumes covers an Attach that stopped part-way (podgate crashed): a later Attach
// finds the interface by its mark, and Detach gives it back whole.
func TestAttachResumes(t *testing.T) {
	testnet.RequireNetAdmin(t)
	checkThreadsHome(t)
	mark := markOf(Attached{HostName: "pgeth0", MTU: 1500, Up: true, Alias: "uplink to rack 7"}).alias()
	tests := []struct {
		name        string
		interrupted func(t *testing.T, host, pod string)
	}{
		{"after the mark", func(t *testing.T, host, _ string) {
			inNetns(t, host, "link", "set", "pgeth0", "alias", mark)
		}},
		{"after the move", func(t *testing.T, host, pod string) {
			inNetns(t, host, "link", "set", "pgeth0", "alias", mark)
			inNetns(t, host, "link", "set", "pgeth0", "netns", filepath.Base(pod))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			host, pod := testNetns(t), testNetns(t)
			wantHost := hostLink(t, host, "pgeth0", true)
			tc.interrupted(t, host, pod)
			hostH, podH := handleAt(t, host), handleAt(t, pod)
			m := linkMover{hostNetns: host}

			cfg := InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24"}}
			a, err := m.attach(ctx, "pgeth0", pod, cfg)
			if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			wantPod := linkState{Name: "net1", MTU: 1400, Up: true, Alias: mark, Addrs: cfg.Addresses}
			if got, _ := stateOf(t, podH, "net1"); !equalState(got, wantPod) {
				t.Errorf("in the pod: %+v, want %+v", got, wantPod)
			}
			if err := m.detach(ctx, a, pod); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			if got, ok := stateOf(t, hostH, "pgeth0"); !ok || !equalState(got, wantHost) {
				t.Errorf("on the host: %+v (found %t), want %+v", got, ok, wantHost)
			}
		})
	}
}

// TestDetachPodNetnsGone covers Detach once the pod's namespace is gone: a veth end is
// destroyed with it; a physical interface comes back to the host under its pod name (made
// here by hand), and Detach restores it.
func TestDetachPodNetnsGone(t *testing.T) {
	testnet.RequireNetAdmin(t)
	checkThreadsHome(t)
	for _, returned := range []bool{false, true} {
		t.Run(fmt.Sprintf("returned=%t", returned), func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			host, pod := testNetns(t), testNetns(t)
			wantHost := hostLink(t, host, "pgeth0", false)
			hostH := handleAt(t, host)
			m := linkMover{hostNetns: host}
			a, err := m.attach(ctx, "pgeth0", pod, InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24"}})
			if err != nil {
				t.Fatalf("Attach: %v", err)
			}
			if returned {
				inNetns(t, pod, "link", "set", "net1", "netns", filepath.Base(host))
			}
			testnet.IP(t, "netns", "del", filepath.Base(pod))

			if err := m.detach(ctx, a, pod); err != nil {
				t.Fatalf("Detach: %v", err)
			}
			got, ok := stateOf(t, hostH, "pgeth0")
			switch {
			case returned && (!ok || !equalState(got, wantHost)):
				t.Errorf("on the host: %+v (found %t), want %+v", got, ok, wantHost)
			case !returned && ok:
				t.Errorf("destroyed veth end on the host: %+v", got)
			}
		})
	}
}

func linkNames(t *testing.T, h *netlink.Handle) []string {
	t.Helper()
	links, err := ListLinks(h)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

func equalState(a, b linkState) bool {
	return a.Name == b.Name && a.MTU == b.MTU && a.Up == b.Up && a.Alias == b.Alias && slices.Equal(a.Addrs, b.Addrs)
}

func equalAttached(a, b Attached) bool {
	return a.HostName == b.HostName && a.PodName == b.PodName && a.MTU == b.MTU && a.Up == b.Up &&
		a.Alias == b.Alias && a.HardwareAddr == b.HardwareAddr && slices.Equal(a.Addresses, b.Addresses)
}

func TestAttachMarkRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		mark linkMark
		want linkMark
	}{
		{"plain", linkMark{Name: "eth5", MTU: 9000, Up: true}, linkMark{Name: "eth5", MTU: 9000, Up: true}},
		{"alias", linkMark{Name: "eth5", MTU: 1500, Alias: "to rack 7"}, linkMark{Name: "eth5", MTU: 1500, Alias: "to rack 7"}},
		{"alias too long", linkMark{Name: "eth5", MTU: 1500, Alias: strings.Repeat("x", 250)}, linkMark{Name: "eth5", MTU: 1500}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			alias := tc.mark.alias()
			if len(alias) > maxAliasLen {
				t.Errorf("alias of %d bytes", len(alias))
			}
			if got, ok := parseLinkMark(alias); !ok || got != tc.want {
				t.Errorf("parseLinkMark(%q) = %+v, %t; want %+v", alias, got, ok, tc.want)
			}
		})
	}
	for _, alias := range []string{"", "uplink", "podgate:", "podgate:{", `podgate:{"mtu":1}`} {
		if m, ok := parseLinkMark(alias); ok {
			t.Errorf("parseLinkMark(%q) = %+v, want no mark", alias, m)
		}
	}
}

func TestDetachWithoutNames(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, a := range []Attached{{}, {HostName: "eth5"}, {PodName: "net1"}} {
		if err := Detach(ctx, a, "/run/netns/none"); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Detach(%+v): %v, want an invalid argument", a, err)
		}
	}
}

// TestResumeAndReclaimAfterACrash covers what podgate does at start-up with an Attach that a
// crash interrupted before podgate recorded its answer, at each point: Resume finishes it only
// when the interface is in the pod (it never moves one from the host); Reclaim gives back
// whatever the Attach left, from podgate's mark alone, and finds nothing the second time.
func TestResumeAndReclaimAfterACrash(t *testing.T) {
	testnet.RequireNetAdmin(t)
	checkThreadsHome(t)
	cfg := InterfaceConfig{Name: "net1", MTU: 1400, Addresses: []string{"192.0.2.10/24"}}
	mark := markOf(Attached{HostName: "pgeth0", MTU: 1500, Up: true, Alias: "uplink to rack 7"}).alias()
	tests := []struct {
		name        string
		interrupted func(t *testing.T, m linkMover, host, pod string)
		inPod       bool // Resume finds the interface in the pod
		podGone     bool // the pod's namespace is gone when podgate looks
	}{
		{name: "before the mark", interrupted: func(*testing.T, linkMover, string, string) {}},
		{name: "after the mark", interrupted: func(t *testing.T, _ linkMover, host, _ string) {
			inNetns(t, host, "link", "set", "pgeth0", "alias", mark)
		}},
		{name: "after the move", inPod: true, interrupted: func(t *testing.T, _ linkMover, host, pod string) {
			inNetns(t, host, "link", "set", "pgeth0", "alias", mark)
			inNetns(t, host, "link", "set", "pgeth0", "netns", filepath.Base(pod), "name", "net1")
		}},
		{name: "attached", inPod: true, interrupted: func(t *testing.T, m linkMover, _, pod string) {
			if _, err := m.attach(t.Context(), "pgeth0", pod, cfg); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "returned to the host under its pod name", podGone: true, interrupted: func(t *testing.T, m linkMover, host, pod string) {
			if _, err := m.attach(t.Context(), "pgeth0", pod, cfg); err != nil {
				t.Fatal(err)
			}
			inNetns(t, pod, "link", "set", "net1", "netns", filepath.Base(host))
			testnet.IP(t, "netns", "del", filepath.Base(pod))
		}},
	}
	for _, tc := range tests {
		for _, op := range []string{"resume", "reclaim"} {
			t.Run(tc.name+"/"+op, func(t *testing.T) {
				t.Parallel()
				_, ctx := ktesting.NewTestContext(t)
				host, pod := testNetns(t), testNetns(t)
				wantHost := hostLink(t, host, "pgeth0", true)
				hostH := handleAt(t, host)
				m := linkMover{hostNetns: host}
				tc.interrupted(t, m, host, pod)
				var hostAfterResume linkState
				if !tc.podGone {
					hostAfterResume, _ = stateOf(t, hostH, "pgeth0")
				}

				if op == "resume" {
					a, found, err := m.resume(ctx, "pgeth0", pod, cfg)
					if err != nil || found != tc.inPod {
						t.Fatalf("Resume: found %t, %v; want found %t, no error", found, err, tc.inPod)
					}
					if !found {
						if got, _ := stateOf(t, hostH, "pgeth0"); !equalState(got, hostAfterResume) {
							t.Errorf("Resume changed the host's interface: %+v, was %+v", got, hostAfterResume)
						}
						if !tc.podGone {
							if names := linkNames(t, handleAt(t, pod)); slices.Contains(names, "net1") {
								t.Errorf("Resume moved the interface into the pod: %v", names)
							}
						}
					} else {
						wantPod := linkState{Name: "net1", MTU: 1400, Up: true, Alias: mark, Addrs: cfg.Addresses}
						if got, _ := stateOf(t, handleAt(t, pod), "net1"); !equalState(got, wantPod) {
							t.Errorf("in the pod after Resume: %+v, want %+v", got, wantPod)
						}
						wantA := Attached{HostName: "pgeth0", PodName: "net1", MTU: 1500, Up: true, Alias: "uplink to rack 7", HardwareAddr: a.HardwareAddr, Addresses: cfg.Addresses}
						if !equalAttached(a, wantA) {
							t.Errorf("Resume = %+v, want %+v", a, wantA)
						}
						if err := m.detach(ctx, a, pod); err != nil {
							t.Fatalf("Detach: %v", err)
						}
						if got, ok := stateOf(t, hostH, "pgeth0"); !ok || !equalState(got, wantHost) {
							t.Errorf("on the host after Detach: %+v (found %t), want %+v", got, ok, wantHost)
						}
					}
					return
				}
				for i := range 2 {
					if err := m.reclaim(ctx, "pgeth0", pod); err != nil {
						t.Fatalf("Reclaim %d: %v", i+1, err)
					}
					if got, ok := stateOf(t, hostH, "pgeth0"); !ok || !equalState(got, wantHost) {
						t.Errorf("on the host after Reclaim %d: %+v (found %t), want %+v", i+1, got, ok, wantHost)
					}
					if !tc.podGone {
						if names := linkNames(t, handleAt(t, pod)); slices.Contains(names, "net1") {
							t.Errorf("still in the pod after Reclaim %d: %v", i+1, names)
						}
					}
				}
			})
		}
	}
}

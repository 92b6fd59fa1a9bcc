package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"

	"github.com/podgate/podgate/podresources/cgroup"
)

// TestScriptsParse: every shell script of the lane, the guest's runner among them, parses
// (bash -n): they run only inside a VM that make test does not boot.
func TestScriptsParse(t *testing.T) {
	scripts, err := filepath.Glob("*.sh")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("scripts/*.sh")
	if err != nil {
		t.Fatal(err)
	}
	scripts = append(append(scripts, more...), "guest/usr/local/sbin/podgate-vm-run")
	if len(scripts) < 8 {
		t.Fatalf("found only %v", scripts)
	}
	for _, s := range scripts {
		if out, err := exec.CommandContext(context.Background(), "bash", "-n", s).CombinedOutput(); err != nil {
			t.Errorf("bash -n %s: %v\n%s", s, err, out)
		}
		checkWaits(t, s)
	}
}

// waitOnSubstitution is a wait_until whose arguments hold a command substitution: bash expands
// it once, before the first try, so the wait polls a constant.
var waitOnSubstitution = regexp.MustCompile(`wait_until [0-9]+ [^;&|#]*\$\(`)

// checkWaits reports each wait_until of script that would poll a constant.
func checkWaits(t *testing.T, script string) {
	t.Helper()
	b, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(b), "\n") {
		if waitOnSubstitution.MatchString(line) {
			t.Errorf("%s:%d: wait_until with $(...) in its arguments polls what it was once: wrap the check in a function\n%s", script, i+1, line)
		}
	}
}

// notExecutable is systemd-analyze verify's finding on a command that exists only in the
// node image (the rig's binaries in /usr/local, the runner): not the unit's fault.
var notExecutable = regexp.MustCompile(`^[a-z-]+\.service: Command /usr/local/s?bin/[a-z-]+ is not executable: No such file or directory$`)

// TestGuestUnitsVerify: the guest's units pass systemd-analyze verify, but for their commands
// being absent from this machine.
func TestGuestUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (test/rig/install.sh tools installs systemd)")
	}
	units, err := filepath.Glob("guest/etc/systemd/system/*.service")
	if err != nil || len(units) != 3 {
		t.Fatalf("guest units %v (%v), want containerd, kubelet and podgate-vm-run", units, err)
	}
	out, _ := exec.CommandContext(context.Background(), analyze, append([]string{"verify"}, units...)...).CombinedOutput()
	for line := range strings.Lines(string(out)) {
		if line = strings.TrimSpace(line); line != "" && !notExecutable.MatchString(line) {
			t.Errorf("systemd-analyze verify: %s", line)
		}
	}
}

// TestGuestKubeletConfig: podgate reads the guest kubelet's configuration file as the kubelet
// means it (resources.kubeletConfig in the VM): the systemd cgroup driver and the MemoryQoS
// settings the kubelet.sh checks count on.
func TestGuestKubeletConfig(t *testing.T) {
	cfg, err := cgroup.ReadKubeletConfig("guest/var/lib/kubelet/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CgroupDriver != "systemd" {
		t.Errorf("cgroupDriver %q, want systemd", cfg.CgroupDriver)
	}
	if cfg.MemoryReservationPolicy != kubeletconfig.TieredReservationMemoryReservationPolicy {
		t.Errorf("memoryReservationPolicy %q, want TieredReservation (kubelet.sh expects memory.low = the request)", cfg.MemoryReservationPolicy)
	}
	if f := cfg.MemoryThrottlingFactor; f == nil || *f != 0.9 {
		t.Errorf("memoryThrottlingFactor %v, want 0.9 (kubelet.sh expects memory.high of it; the kubelet 1.37 writes none without it)", f)
	}
	if cfg.StaticPodPath != "/etc/kubernetes/manifests" {
		t.Errorf("staticPodPath %q", cfg.StaticPodPath)
	}
}

// TestGuestContainerdSystemdCgroup: the guest's containerd runs runc with the systemd cgroup
// driver, the lane's point.
func TestGuestContainerdSystemdCgroup(t *testing.T) {
	b, err := os.ReadFile("guest/etc/containerd/config.toml")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^\s*SystemdCgroup = true$`).Match(b) {
		t.Errorf("guest containerd config without SystemdCgroup = true:\n%s", b)
	}
}

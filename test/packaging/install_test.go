package packaging

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// Paths of the installed package on this machine, beside packagedFiles.
const (
	unitPath      = "/lib/systemd/system/podgate.service"
	wantsLink     = "/etc/systemd/system/multi-user.target.wants/podgate.service"
	maskLink      = "/etc/systemd/system/podgate.service"
	configPath    = "/etc/podgate/config.yaml"
	dropInPath    = "/etc/kubernetes/kubelet.conf.d/50-podgate.conf"
	stateDir      = "/var/lib/podgate"
	docDir        = "/usr/share/doc/podgate"
	dropInDir     = "/etc/kubernetes/kubelet.conf.d"
	kubernetesDir = "/etc/kubernetes"
)

// debStatus is dpkg's status of the podgate package ("install ok installed", "deinstall ok
// config-files"), "" when dpkg does not know it.
func debStatus(t testing.TB) string {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), "dpkg-query", "--show", "--showformat", "${Status}", "podgate").Output()
	if err != nil {
		return ""
	}
	if s := strings.TrimSpace(string(out)); s != "purge ok not-installed" && s != "unknown ok not-installed" {
		return s
	}
	return ""
}

// requireInstallable skips the test unless it may install the package here: root, dpkg, an
// amd64 or arm64 machine, and nothing of podgate's installed already (a package, or make
// install's files), which the test would overwrite or purge.
func requireInstallable(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: dpkg -i writes /usr/bin, /etc and /lib/systemd/system")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("dpkg is not installed: the install tests need a Debian-based machine")
	}
	if !slices.Contains(arches, runtime.GOARCH) {
		t.Skipf("no package for %s", runtime.GOARCH)
	}
	if s := debStatus(t); s != "" {
		t.Skipf("a podgate package is on this machine (%s): the test would replace and purge it", s)
	}
	for _, p := range []string{"/usr/bin/podgate", unitPath, maskLink, wantsLink, configPath, dropInPath, stateDir, docDir} {
		if _, err := os.Lstat(p); err == nil {
			t.Skipf("%s exists: podgate is installed here by other means, and the test would remove it", p)
		}
	}
}

// dpkg runs dpkg with args, without standard input (as apt in a script), and returns its output.
func dpkg(t testing.TB, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(context.Background(), "dpkg", args...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// installDeb installs the package of version and purges it when the test ends, whatever state
// the test left it in.
func installDeb(t *testing.T, version string) string {
	t.Helper()
	deb := debFile(makeRelease(t, version), version, runtime.GOARCH)
	t.Cleanup(func() {
		if s := debStatus(t); s != "" {
			if out, err := exec.CommandContext(context.Background(), "dpkg", "--purge", "podgate").CombinedOutput(); err != nil {
				t.Errorf("cleanup: dpkg --purge podgate (%s): %v\n%s", s, err, out)
			}
		}
	})
	return dpkg(t, "--install", deb)
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// TestDebInstallUpgradeRemovePurge installs the .deb with dpkg -i on this machine: the files
// are the repository's, the unit is enabled (not started: no systemd runs here) and passes
// systemd-analyze verify, the config passes podgate check-config. An edited config survives
// the upgrade to a newer package. dpkg -r leaves the conffiles, podgate's state and the unit's
// enablement (masked, as dh_installsystemd does); dpkg -P leaves nothing.
func TestDebInstallUpgradeRemovePurge(t *testing.T) {
	requireInstallable(t)
	hadKubernetesDir, hadDropInDir := exists(kubernetesDir), exists(dropInDir)
	oldDir, newDir := makeRelease(t, oldVersion), makeRelease(t, newVersion)

	out := installDeb(t, oldVersion)
	if !strings.Contains(out, "podgate: installed and enabled") {
		t.Errorf("dpkg -i: postinst's note missing:\n%s", out)
	}
	if s := debStatus(t); s != "install ok installed" {
		t.Fatalf("after dpkg -i: status %q", s)
	}
	checkInstalledFiles(t, filepath.Join(oldDir, "podgate-linux-"+runtime.GOARCH))
	if target, err := os.Readlink(wantsLink); err != nil || target != unitPath {
		t.Errorf("unit not enabled: %s -> %q (%v), want -> %s", wantsLink, target, err, unitPath)
	}
	verifyUnit(t)
	checkConfig(t)
	checkVersion(t, oldVersion)

	// The operator's edit, and the state podgate writes.
	orig, err := os.ReadFile(configPath)
	if err != nil {
		t.Fatal(err)
	}
	edited := append(bytes.Clone(orig), "# kept across upgrades (TestDebInstallUpgradeRemovePurge)\n"...)
	if err := os.WriteFile(configPath, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stateDir, "state-of-the-test"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}

	dpkg(t, "--install", debFile(newDir, newVersion, runtime.GOARCH))
	if v := run(t, "dpkg-query", "--show", "--showformat", "${Version}", "podgate"); v != "0.0.2-1" {
		t.Errorf("after the upgrade: version %q, want 0.0.2-1", v)
	}
	checkVersion(t, newVersion)
	if got, err := os.ReadFile(configPath); err != nil || !bytes.Equal(got, edited) {
		t.Errorf("the upgrade did not keep the edited %s (%v):\n%s", configPath, err, got)
	}
	for _, suffix := range []string{".dpkg-new", ".dpkg-dist", ".dpkg-old"} {
		if exists(configPath + suffix) {
			t.Errorf("the upgrade left %s%s", configPath, suffix)
		}
	}
	checkConfig(t)
	if target, err := os.Readlink(wantsLink); err != nil || target != unitPath {
		t.Errorf("after the upgrade the unit is no longer enabled: %q %v", target, err)
	}

	dpkg(t, "--remove", "podgate")
	if s := debStatus(t); s != "deinstall ok config-files" {
		t.Errorf("after dpkg -r: status %q, want deinstall ok config-files", s)
	}
	for _, gone := range []string{"/usr/bin/podgate", unitPath, docDir} {
		if exists(gone) {
			t.Errorf("dpkg -r left %s", gone)
		}
	}
	// Debian policy: remove keeps the configuration files; and the state is the node's.
	if got, err := os.ReadFile(configPath); err != nil || !bytes.Equal(got, edited) {
		t.Errorf("dpkg -r did not keep the edited %s: %v", configPath, err)
	}
	for _, kept := range []string{dropInPath, filepath.Join(stateDir, "state-of-the-test"), wantsLink} {
		if !exists(kept) {
			t.Errorf("dpkg -r removed %s", kept)
		}
	}
	if target, err := os.Readlink(maskLink); err != nil || target != "/dev/null" {
		t.Errorf("dpkg -r: %s -> %q (%v), want the mask -> /dev/null (the unit is gone, its enablement kept)", maskLink, target, err)
	}

	dpkg(t, "--purge", "podgate")
	if s := debStatus(t); s != "" {
		t.Errorf("after dpkg -P: status %q, want not installed", s)
	}
	for _, gone := range []string{configPath, "/etc/podgate", dropInPath, stateDir, wantsLink, maskLink,
		"/var/lib/systemd/deb-systemd-helper-enabled/podgate.service.dsh-also",
		"/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/podgate.service",
		"/var/lib/systemd/deb-systemd-helper-masked/podgate.service"} {
		if exists(gone) {
			t.Errorf("dpkg -P left %s", gone)
		}
	}
	if !hadDropInDir && exists(dropInDir) {
		t.Errorf("dpkg -P left %s, which the package made", dropInDir)
	}
	if !hadKubernetesDir && exists(kubernetesDir) {
		t.Errorf("dpkg -P left %s, which the package made", kubernetesDir)
	}
}

// checkInstalledFiles compares the installed files with the repository's and the binary.
func checkInstalledFiles(t *testing.T, bin string) {
	t.Helper()
	listed := lines(run(t, "dpkg", "--listfiles", "podgate"))
	for p, want := range packagedFiles(t, "/lib/systemd/system") {
		if !slices.Contains(listed, p) {
			t.Errorf("dpkg -L podgate does not list %s", p)
		}
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("installed: %v", err)
			continue
		}
		wantMode := os.FileMode(0o644)
		if p == "/usr/bin/podgate" {
			wantMode = 0o755
			if want, err = os.ReadFile(bin); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, want) || fi.Mode().Perm() != wantMode {
			t.Errorf("installed %s: mode %v, %d bytes (%v); want mode %v and the repository's %d bytes", p, fi.Mode().Perm(), len(got), err, wantMode, len(want))
		}
	}
}

// verifyUnit runs systemd-analyze verify on the installed unit, when systemd-analyze is here.
func verifyUnit(t *testing.T) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Log("systemd-analyze is not installed: the unit is not verified")
		return
	}
	out, err := exec.CommandContext(context.Background(), analyze, "verify", unitPath).CombinedOutput()
	// verify also reports on the units it loads beside (containerd.service, kubelet.service
	// missing here): only podgate.service's own findings count.
	if err != nil && strings.Contains(string(out), "podgate.service") || strings.Contains(string(out), "podgate.service") {
		t.Errorf("systemd-analyze verify %s: %v\n%s", unitPath, err, out)
	}
}

// checkConfig runs the installed podgate check-config on the installed config.
func checkConfig(t *testing.T) {
	t.Helper()
	out, err := exec.CommandContext(context.Background(), "/usr/bin/podgate", "check-config", configPath).CombinedOutput()
	if err != nil || !strings.Contains(string(out), configPath+": ok") {
		t.Errorf("podgate check-config %s: %v\n%s", configPath, err, out)
	}
}

// checkVersion checks the installed binary's version line.
func checkVersion(t *testing.T, version string) {
	t.Helper()
	if out := run(t, "/usr/bin/podgate", "version"); !strings.HasPrefix(out, "podgate "+version+"\ncommit: ") {
		t.Errorf("installed podgate version:\n%s\nwant podgate %s first", out, version)
	}
}

package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podgate/podgate/agent/config"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// TestMakeInstall runs `make install` and `make uninstall` into a scratch DESTDIR, as a package
// build would: the binary under PREFIX, the unit (its ExecStart following PREFIX, accepted by
// systemd-analyze), the commented config (an existing one kept), the kubelet drop-in (a strict
// KubeletConfiguration pointing at podgate's socket); uninstall leaves only the config.
func TestMakeInstall(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("make is not installed")
	}
	root := filepath.Join("..", "..")
	dest := t.TempDir()
	makeIt := func(target string) {
		t.Helper()
		cmd := exec.CommandContext(context.Background(), "make", "-C", root, target, "DESTDIR="+dest, "PREFIX=/usr")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make %s: %v\n%s", target, err, out)
		}
	}
	makeIt("install")
	files := map[string]os.FileMode{
		"usr/bin/podgate": 0o755, "etc/systemd/system/podgate.service": 0o644,
		"etc/podgate/config.yaml": 0o644, "etc/kubernetes/kubelet.conf.d/50-podgate.conf": 0o644,
	}
	for f, mode := range files {
		fi, err := os.Stat(filepath.Join(dest, f))
		if err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v; want mode %v", f, err, fi.Mode().Perm(), mode)
		}
	}
	unit, err := os.ReadFile(filepath.Join(dest, "etc/systemd/system/podgate.service"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nExecStart=/usr/bin/podgate --config /etc/podgate/config.yaml\n") {
		t.Errorf("installed unit's ExecStart does not follow PREFIX=/usr:\n%s", unit)
	}
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		// verify checks that ExecStart's binary exists: point it at the installed one.
		copied := filepath.Join(t.TempDir(), "podgate.service")
		body := strings.Replace(string(unit), "ExecStart=/usr/bin/podgate ", "ExecStart="+filepath.Join(dest, "usr/bin/podgate")+" ", 1)
		if err := os.WriteFile(copied, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.CommandContext(context.Background(), analyze, "verify", copied).CombinedOutput(); err != nil || strings.Contains(string(out), "podgate.service") {
			t.Errorf("systemd-analyze verify of the installed unit: %v\n%s", err, out)
		}
	}
	if _, err := config.LoadFile(filepath.Join(dest, "etc/podgate/config.yaml")); err != nil {
		t.Errorf("installed config: %v", err)
	}
	dropIn, err := os.ReadFile(filepath.Join(dest, "etc/kubernetes/kubelet.conf.d/50-podgate.conf"))
	if err != nil {
		t.Fatal(err)
	}
	var kc kubeletconfig.KubeletConfiguration
	if err := yaml.UnmarshalStrict(dropIn, &kc); err != nil {
		t.Fatalf("kubelet drop-in: %v", err)
	}
	want := "unix://" + config.DefaultCRISocket
	if kc.Kind != "KubeletConfiguration" || kc.APIVersion != "kubelet.config.k8s.io/v1beta1" || kc.ContainerRuntimeEndpoint != want || kc.ImageServiceEndpoint != want {
		t.Errorf("kubelet drop-in = %s/%s runtime %q image %q; want KubeletConfiguration with both endpoints %s",
			kc.APIVersion, kc.Kind, kc.ContainerRuntimeEndpoint, kc.ImageServiceEndpoint, want)
	}

	// A second install keeps the operator's config.
	mine := []byte("apiVersion: podgate.dev/v1alpha1\nkind: AgentConfiguration\nnodeName: mine\n")
	if err := os.WriteFile(filepath.Join(dest, "etc/podgate/config.yaml"), mine, 0o644); err != nil {
		t.Fatal(err)
	}
	makeIt("install")
	if got, _ := os.ReadFile(filepath.Join(dest, "etc/podgate/config.yaml")); string(got) != string(mine) {
		t.Errorf("install replaced an existing config:\n%s", got)
	}

	makeIt("uninstall")
	for f := range files {
		_, err := os.Stat(filepath.Join(dest, f))
		if f == "etc/podgate/config.yaml" {
			if err != nil {
				t.Errorf("uninstall removed the config: %v", err)
			}
		} else if !os.IsNotExist(err) {
			t.Errorf("%s still there after uninstall: %v", f, err)
		}
	}
}

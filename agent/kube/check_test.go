package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckKubeconfig: a kubeconfig that loads is fine, none (empty) too; a missing or
// unreadable one is an error naming the file.
func TestCheckKubeconfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("kubeconfig", `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`)
	for _, p := range []string{"", good} {
		if err := CheckKubeconfig(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{filepath.Join(dir, "nonexistent"), write("garbage", "{this is: [not a kubeconfig\n")} {
		if err := CheckKubeconfig(p); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want an error naming the file", p, err)
		}
	}
}

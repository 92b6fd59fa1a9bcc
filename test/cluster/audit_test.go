//go:build linux

package cluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestAuditReader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	get := `{"auditID":"a","stage":"ResponseComplete","verb":"get","userAgent":"podgate","user":{"username":"admin"},` +
		`"objectRef":{"resource":"resourceclaims","namespace":"ns","name":"c","apiGroup":"resource.k8s.io"},` +
		`"responseStatus":{"code":200},"requestReceivedTimestamp":"2026-11-25T10:00:02.000000Z"}` + "\n"
	watchStarted := `{"auditID":"w","stage":"ResponseStarted","verb":"watch","userAgent":"kubelet/v1.36.3",` +
		`"objectRef":{"resource":"pods"},"requestURI":"/api/v1/pods?watch=true",` +
		`"requestReceivedTimestamp":"2026-11-25T10:00:01.000000Z"}` + "\n"
	watchDone := `{"auditID":"w","stage":"ResponseComplete","verb":"watch","userAgent":"kubelet/v1.36.3",` +
		`"objectRef":{"resource":"pods"},"requestURI":"/api/v1/pods?watch=true","responseStatus":{"code":200},` +
		`"requestReceivedTimestamp":"2026-11-25T10:00:01.000000Z"}` + "\n"
	// kube-apiserver is half-way through the watch's last line.
	half := len(watchDone) / 2
	if err := os.WriteFile(path, []byte(get+watchStarted+watchDone[:half]), 0o644); err != nil {
		t.Fatal(err)
	}
	r := NewAuditReader(path)
	reqs, err := r.Requests()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[0].AuditID != "w" || reqs[0].Stage != "ResponseStarted" || reqs[0].Code != 0 ||
		reqs[1].AuditID != "a" || reqs[1].Resource != "resourceclaims" || reqs[1].Namespace != "ns" || reqs[1].Code != 200 {
		t.Fatalf("requests %+v, want the open watch (received first), then the GET", reqs)
	}

	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(watchDone[half:]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	reqs, err = r.Requests()
	if err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 11, 25, 10, 0, 1, 0, time.UTC)
	if len(reqs) != 2 || reqs[0].Stage != "ResponseComplete" || reqs[0].Code != 200 || !reqs[0].Received.Equal(want) ||
		reqs[0].UserAgent != "kubelet/v1.36.3" || reqs[1].Username != "admin" {
		t.Fatalf("requests %+v, want the watch ended with 200, still one request", reqs)
	}
	all, err := ReadAudit(path)
	if err != nil || len(all) != 2 {
		t.Fatalf("ReadAudit: %+v, %v; want the same 2 requests", all, err)
	}
}

//go:build linux

package cluster

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// auditPolicy logs every request at the Metadata level: who asked what of which object, with
// the answer's code, and no bodies. The stage RequestReceived is left out, so that a request
// is one line when it ends (ResponseComplete), and a watch one more when it starts
// (ResponseStarted): a watch still open shows up too.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// auditLogMaxSizeMB keeps kube-apiserver from rotating the audit log (its default, 0, means
// lumberjack's 100 MB): ReadAudit reads one file.
const auditLogMaxSizeMB = 100000

// AuditLogPath is kube-apiserver's audit log (Options.AuditLog).
func (c *Cluster) AuditLogPath() string { return filepath.Join(c.dir, "audit.log") }

func (c *Cluster) auditPolicyPath() string { return filepath.Join(c.dir, "audit-policy.yaml") }

func (c *Cluster) writeAuditPolicy() error {
	if err := os.WriteFile(c.auditPolicyPath(), []byte(auditPolicy), 0o644); err != nil {
		return fmt.Errorf("audit policy: %w", err)
	}
	return nil
}

// auditArgs are kube-apiserver's flags for the audit log. The log backend's default mode,
// blocking, writes a request's line before the request ends: once a client has its answer,
// ReadAudit sees the request.
func (c *Cluster) auditArgs() []string {
	return []string{
		"--audit-policy-file=" + c.auditPolicyPath(),
		"--audit-log-path=" + c.AuditLogPath(),
		"--audit-log-format=json",
		fmt.Sprintf("--audit-log-maxsize=%d", auditLogMaxSizeMB),
	}
}

// AuditRequest is one request to kube-apiserver as its audit log shows it.
type AuditRequest struct {
	AuditID string
	// Stage is the last stage logged: ResponseComplete, or ResponseStarted for a watch still
	// open.
	Stage     string
	Verb      string
	UserAgent string
	Username  string
	// APIGroup, Resource, Subresource, Namespace and Name are the object asked about; all
	// empty for a non-resource URL such as /readyz (RequestURI says which).
	APIGroup, Resource, Subresource, Namespace, Name string
	RequestURI                                       string
	// Code is the answer's HTTP status code; 0 while a watch is open.
	Code int
	// Received is when kube-apiserver received the request.
	Received time.Time
}

// auditEvent is the part of an audit.k8s.io/v1 Event that AuditRequest holds.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		APIGroup    string `json:"apiGroup"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// ReadAudit reads an audit log written with Options.AuditLog: one AuditRequest per request, in
// the order kube-apiserver received them.
func ReadAudit(path string) ([]AuditRequest, error) { return NewAuditReader(path).Requests() }

// AuditReader reads an audit log as it grows: each Requests reads only the lines written since
// the last. It is not safe for concurrent use.
type AuditReader struct {
	path   string
	offset int64
	byID   map[string]int
	reqs   []AuditRequest
}

// NewAuditReader returns a reader of the audit log at path (AuditLogPath).
func NewAuditReader(path string) *AuditReader {
	return &AuditReader{path: path, byID: map[string]int{}}
}

// Requests returns every request the log holds so far, one per request, in the order
// kube-apiserver received them. The slice is the caller's.
func (a *AuditReader) Requests() ([]AuditRequest, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	// kube-apiserver may be writing a line right now: read the complete ones.
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("read audit log %s: %w: %s", a.path, err, line)
		}
		a.add(ev)
	}
	a.offset += int64(len(data))
	out := slices.Clone(a.reqs)
	slices.SortStableFunc(out, func(x, y AuditRequest) int { return x.Received.Compare(y.Received) })
	return out, nil
}

// add records ev; a watch's ResponseComplete replaces its ResponseStarted.
func (a *AuditReader) add(ev auditEvent) {
	r := AuditRequest{
		AuditID: ev.AuditID, Stage: ev.Stage, Verb: ev.Verb, UserAgent: ev.UserAgent, Username: ev.User.Username,
		RequestURI: ev.RequestURI, Received: ev.RequestReceivedTimestamp,
	}
	if o := ev.ObjectRef; o != nil {
		r.APIGroup, r.Resource, r.Subresource, r.Namespace, r.Name = o.APIGroup, o.Resource, o.Subresource, o.Namespace, o.Name
	}
	if ev.ResponseStatus != nil {
		r.Code = ev.ResponseStatus.Code
	}
	if i, ok := a.byID[ev.AuditID]; ok {
		a.reqs[i] = r
		return
	}
	a.byID[ev.AuditID] = len(a.reqs)
	a.reqs = append(a.reqs, r)
}

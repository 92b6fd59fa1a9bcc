package driver

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Operations recorded in [Event.Op].
const (
	OpPrepare   = "prepare"
	OpUnprepare = "unprepare"
)

// Stats counts what the driver was asked to do since it started. Tests read it with
// [Driver.Stats] or as JSON from [Driver.ServeHTTP].
type Stats struct {
	// PrepareCalls counts NodePrepareResources calls that reached the driver (one call may
	// carry several claims).
	PrepareCalls int64 `json:"prepareCalls"`
	// PrepareCallsByCaller splits PrepareCalls by the caller's command name ("kubelet",
	// "podgate"; "unknown" if it could not be found).
	PrepareCallsByCaller map[string]int64 `json:"prepareCallsByCaller"`
	// UnprepareCalls counts NodeUnprepareResources calls that reached the driver.
	UnprepareCalls int64 `json:"unprepareCalls"`
	// ClaimPrepares counts claims prepared successfully, repeats included.
	ClaimPrepares int64 `json:"claimPrepares"`
	// ClaimPrepareErrors counts claims whose preparation failed.
	ClaimPrepareErrors int64 `json:"claimPrepareErrors"`
	// ClaimUnprepares counts claims unprepared successfully, including claims that were not
	// prepared (unprepare is idempotent).
	ClaimUnprepares int64 `json:"claimUnprepares"`
	// Prepared holds the claims prepared now, by claim UID.
	Prepared map[types.UID]PreparedClaim `json:"prepared"`
}

// Event is one line of the events file: the outcome of preparing or unpreparing one claim.
type Event struct {
	// Time is when the driver finished with the claim.
	Time time.Time `json:"time"`
	// Op is OpPrepare or OpUnprepare.
	Op string `json:"op"`
	// Namespace, Name and UID identify the claim.
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid"`
	// Caller is the process that made the gRPC call.
	Caller Caller `json:"caller"`
	// Devices lists the claim's devices of this driver.
	Devices []string `json:"devices"`
	// Interfaces lists the host interfaces of those devices.
	Interfaces []string `json:"interfaces"`
	// Created lists the interfaces this prepare created; the others existed already.
	Created []string `json:"created,omitempty"`
	// Error is the failure, empty on success.
	Error string `json:"error,omitempty"`
}

// eventLog appends events to a JSON-lines file. Each event is one write of one line on a file
// opened with O_APPEND, so a reader never sees half a line from a running driver.
type eventLog struct {
	mu   sync.Mutex
	file *os.File
}

// openEventLog opens path for appending; an empty path gives a log that drops everything.
func openEventLog(path string) (*eventLog, error) {
	if path == "" {
		return &eventLog{}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open events file: %w", err)
	}
	return &eventLog{file: f}, nil
}

func (l *eventLog) write(ev Event) error {
	if l.file == nil {
		return nil
	}
	line, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.file.Write(append(line, '\n'))
	return err
}

func (l *eventLog) close() error {
	if l.file == nil {
		return nil
	}
	return l.file.Close()
}

// ReadEvents reads an events file written by the driver (the --events-file flag of
// test/dradriver). A missing file yields no events and an error, as it means no driver wrote it.
func ReadEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var events []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return events, fmt.Errorf("%s line %d: %w", path, len(events)+1, err)
		}
		events = append(events, ev)
	}
	return events, sc.Err()
}

// ServeHTTP serves the driver's [Stats] as JSON, for tests that run the driver as a program
// (the --status-address flag of test/dradriver).
func (d *Driver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "only GET", http.StatusMethodNotAllowed)
		return
	}
	data, err := json.Marshal(d.Stats())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(data, '\n'))
}

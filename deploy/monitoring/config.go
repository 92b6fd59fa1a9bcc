package monitoring

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"time"

	"github.com/prometheus/common/model"
	"go.yaml.in/yaml/v3"
)

// Config holds the parameters of the rules and the dashboard: where podgate's series are, the
// label that names a node, and each alert's threshold. Durations are Prometheus durations
// ("90s", "10m", "1h"). Keys of a config file are these fields' yaml names; a key left out keeps
// its default.
type Config struct {
	// Selector picks podgate's series: the label matchers of its scrape job.
	Selector string `yaml:"selector"`
	// ContainerdSelector picks containerd's own series (its gRPC metrics), shown beside podgate's.
	ContainerdSelector string `yaml:"containerdSelector"`
	// NodeLabel is the label that tells nodes apart in alerts, recording rules and the
	// dashboard's node selector. To see containerd beside podgate per node, both scrape jobs
	// must carry it with the same value (for example a "node" label set by relabelling).
	NodeLabel string `yaml:"nodeLabel"`
	// RunbookURL is docs/runbook.md as operators read it; each alert's runbook_url is it with
	// the alert's section as the fragment.
	RunbookURL string `yaml:"runbookURL"`

	// BackendDownFor: PodgateBackendDown fires once containerd was unreachable this long.
	BackendDownFor model.Duration `yaml:"backendDownFor"`
	// PodgateDownFor: PodgateDown fires once Prometheus could not scrape podgate this long.
	PodgateDownFor model.Duration `yaml:"podgateDownFor"`
	// PullQueuedFor: PodgateImagePullsQueued fires once pulls waited in podgate's queue, without
	// the queue ever emptying, this long.
	PullQueuedFor model.Duration `yaml:"pullQueuedFor"`
	// EventWindow: the alerts on events (a stalled pull, a sandbox refused for DRA, a failing
	// DRA prepare, a sysctl or cgroup drift) fire at the first one and resolve when the window
	// has seen none.
	EventWindow model.Duration `yaml:"eventWindow"`
	// RefusalWindow is EventWindow for refusals of misbehaving local clients (CRI and
	// PodResources sockets).
	RefusalWindow model.Duration `yaml:"refusalWindow"`
	// PeerVersionFor: PodgatePeerVersionUntested fires once a kubelet or runtime outside the
	// tested range was seen this long.
	PeerVersionFor model.Duration `yaml:"peerVersionFor"`
	// RestartWindow and Restarts: PodgateRestarting fires when podgate started Restarts times
	// or more within RestartWindow.
	RestartWindow model.Duration `yaml:"restartWindow"`
	Restarts      int            `yaml:"restarts"`
	// CRIErrorRatio and CRIErrorsFor: PodgateCRICallsFailing fires when more than this share
	// of the CRI calls failed with Unavailable, Internal, Unknown or DeadlineExceeded for
	// CRIErrorsFor.
	CRIErrorRatio float64        `yaml:"criErrorRatio"`
	CRIErrorsFor  model.Duration `yaml:"criErrorsFor"`
	// RateWindow is the range of the recording rules' rates.
	RateWindow model.Duration `yaml:"rateWindow"`
	// EvaluationInterval, when set, is the rule groups' interval; unset, Prometheus's global
	// evaluation_interval.
	EvaluationInterval model.Duration `yaml:"evaluationInterval"`
}

// Default is the configuration of the shipped files.
func Default() Config {
	return Config{
		Selector:           `job="podgate"`,
		ContainerdSelector: `job="containerd"`,
		NodeLabel:          "instance",
		RunbookURL:         "https://github.com/podgate/podgate/blob/main/docs/runbook.md",
		BackendDownFor:     minutes(1),
		PodgateDownFor:     minutes(5),
		PullQueuedFor:      minutes(10),
		EventWindow:        minutes(10),
		RefusalWindow:      minutes(60),
		PeerVersionFor:     minutes(15),
		RestartWindow:      minutes(15),
		Restarts:           3,
		CRIErrorRatio:      0.1,
		CRIErrorsFor:       minutes(15),
		RateWindow:         minutes(5),
	}
}

func minutes(n int) model.Duration { return model.Duration(time.Duration(n) * time.Minute) }

// LoadConfig reads a YAML file of Config keys over the defaults; unknown keys are errors.
func LoadConfig(path string) (Config, error) {
	cfg := Default()
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

var labelName = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

// Validate says what in c cannot make rules.
func (c Config) Validate() error {
	var errs []error
	if !labelName.MatchString(c.NodeLabel) {
		errs = append(errs, fmt.Errorf("nodeLabel %q is not a label name", c.NodeLabel))
	}
	if c.Selector == "" {
		errs = append(errs, errors.New("selector is empty: podgate's series need one, such as job=\"podgate\""))
	}
	for name, d := range map[string]model.Duration{
		"eventWindow": c.EventWindow, "refusalWindow": c.RefusalWindow, "restartWindow": c.RestartWindow, "rateWindow": c.RateWindow,
	} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be above 0", name))
		}
	}
	if c.Restarts < 1 {
		errs = append(errs, errors.New("restarts must be 1 or more"))
	}
	if c.CRIErrorRatio <= 0 || c.CRIErrorRatio > 1 {
		errs = append(errs, fmt.Errorf("criErrorRatio %v: want above 0, at most 1", c.CRIErrorRatio))
	}
	return errors.Join(errs...)
}

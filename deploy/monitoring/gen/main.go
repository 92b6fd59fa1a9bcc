// Command gen writes podgate's Prometheus rule files and Grafana dashboard (package
// monitoring) into a directory:
//
//	go run ./deploy/monitoring/gen [-config FILE] [-out DIR]
//
// Without -config it writes the shipped files (the defaults); -config FILE holds the keys of
// monitoring.Config to change, such as eventWindow: 30m or nodeLabel: node.
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"github.com/podgate/podgate/deploy/monitoring"
)

func main() {
	config := flag.String("config", "", "YAML file of parameters over the defaults (docs/monitoring.md)")
	out := flag.String("out", "deploy/monitoring", "directory to write the rule files and the dashboard to")
	flag.Parse()
	if err := run(*config, *out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(config, out string) error {
	cfg := monitoring.Default()
	if config != "" {
		var err error
		if cfg, err = monitoring.LoadConfig(config); err != nil {
			return err
		}
	}
	files, err := cfg.Files()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		if err := os.WriteFile(filepath.Join(out, name), files[name], 0o644); err != nil {
			return err
		}
	}
	return nil
}

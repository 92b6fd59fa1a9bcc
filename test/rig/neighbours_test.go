package rig_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/podgate/podgate/test/rig"
)

// TestNeighboursTable keeps docs/compatibility.md's "Tested with" table of the neighbours true:
// one row per neighbour, at the version neighbours.env pins, naming tests of test/cluster that
// exist (one of which runs the neighbour).
func TestNeighboursTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/compatibility.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := neighbourRows(t, string(doc))
	tests := clusterTests(t)
	rowNames := map[string]string{rig.Multus: "multus", rig.DRAExampleDriver: "dra-example-driver", rig.DRANet: "dranet"}
	for bin, name := range rowNames {
		row, ok := rows[name]
		if !ok {
			t.Errorf("docs/compatibility.md: no row for %s in the neighbours table", name)
			continue
		}
		if want := "`" + rig.NeighbourVersion(bin) + "`"; row[1] != want {
			t.Errorf("docs/compatibility.md: %s at %s, neighbours.env pins %s", name, row[1], want)
		}
		if !strings.Contains(row[2], rig.NeighbourModule(bin)) {
			t.Errorf("docs/compatibility.md: %s row does not name its module %s: %q", name, rig.NeighbourModule(bin), row[2])
		}
		named := regexp.MustCompile(`Test[A-Za-z0-9_]+`).FindAllString(row[len(row)-1], -1)
		if len(named) == 0 {
			t.Errorf("docs/compatibility.md: %s row names no test", name)
		}
		for _, test := range named {
			if !tests[test] {
				t.Errorf("docs/compatibility.md: %s row names %s, which test/cluster does not have", name, test)
			}
		}
	}
	if len(rows) != len(rowNames) {
		t.Errorf("docs/compatibility.md: the neighbours table has %d rows, want %d (one per neighbour of neighbours.env)", len(rows), len(rowNames))
	}
}

// neighbourRows are the rows of the table under "## Tested with: the neighbours", by their first
// cell, each split into trimmed cells.
func neighbourRows(t *testing.T, doc string) map[string][]string {
	t.Helper()
	_, section, ok := strings.Cut(doc, "\n## Tested with: the neighbours\n")
	if !ok {
		t.Fatal(`docs/compatibility.md has no section "## Tested with: the neighbours"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string][]string{}
	for _, l := range strings.Split(section, "\n") {
		if !strings.HasPrefix(l, "| ") || strings.HasPrefix(l, "|---") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "| "), " | ")
		if cells[0] == "neighbour" { // the header
			continue
		}
		if len(cells) < 4 {
			t.Fatalf("docs/compatibility.md: neighbours row %q has %d cells, want at least 4", l, len(cells))
		}
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows[strings.Trim(cells[0], "*")] = cells
	}
	return rows
}

// clusterTests are the test functions of test/cluster.
func clusterTests(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../cluster/*_test.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in ../cluster: %v", err)
	}
	tests := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func (Test[A-Za-z0-9_]+)\(t \*testing\.T\)`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			tests[m[1]] = true
		}
	}
	return tests
}

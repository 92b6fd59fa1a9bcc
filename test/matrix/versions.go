package matrix

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// versionLine is one KEY="v1 v2 …" line of versions.env.
var versionLine = regexp.MustCompile(`^([A-Z_]+)="([^"]*)"$`)

// ReadVersions reads a versions.env file: each KEY="v1 v2 …" line, its releases oldest first.
func ReadVersions(path string) (map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := versionLine.FindStringSubmatch(sc.Text()); m != nil {
			out[m[1]] = strings.Fields(m[2])
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}

// Package testfs holds file-system helpers shared by podgate's tests.
package testfs

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// ShortDir returns a new directory under /tmp, removed when the test ends. Unix socket paths
// must stay under 108 bytes, which t.TempDir()'s paths can pass.
func ShortDir(tb testing.TB) string {
	tb.Helper()
	d, err := os.MkdirTemp("/tmp", "pg")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// MarkdownAnchors are the anchors GitHub gives a Markdown file's headings: lower case, spaces
// as hyphens, punctuation but hyphens and underscores dropped, "-1", "-2"... on repeats.
func MarkdownAnchors(t testing.TB, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		h := strings.TrimSpace(strings.TrimLeft(l, "#"))
		var s strings.Builder
		for _, r := range strings.ToLower(h) {
			switch {
			case r == ' ':
				s.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127 && (unicode.IsLetter(r) || unicode.IsDigit(r)):
				s.WriteRune(r)
			}
		}
		slug := s.String()
		if n := seen[slug]; n > 0 {
			a[slug+"-"+strconv.Itoa(n)] = true
		} else {
			a[slug] = true
		}
		seen[slug]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return a
}

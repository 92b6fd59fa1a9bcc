package packaging

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/podgate/podgate/test/testfs"
)

// mdLink is a Markdown link or image target: ](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocumentLinksResolve: every relative link of README.md and docs/*.md (the documents the
// packages ship) names a file or directory of the repository, an anchor names a heading of its
// Markdown file, and none leaves the repository.
func TestDocumentLinksResolve(t *testing.T) {
	root := repoRoot(t)
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := append([]string{filepath.Join(root, "README.md")}, docs...)
	anchors := map[string]map[string]bool{}
	headings := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := testfs.MarkdownAnchors(t, path)
		anchors[path] = a
		return a
	}
	checked := 0
	for _, f := range files {
		body, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for _, m := range mdLink.FindAllStringSubmatch(stripCode(string(body)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			path, anchor, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			if r, err := filepath.Rel(root, dest); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s: link %s leaves the repository", rel, target)
				continue
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %s: %v", rel, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !headings(dest)[anchor] {
				t.Errorf("%s: link %s: no heading with anchor #%s in %s", rel, target, anchor, filepath.Base(dest))
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d relative links, want the documents' many: is the link pattern still right?", checked)
	}
}

// stripCode drops fenced code blocks and inline code, where "](" is not a link.
func stripCode(md string) string {
	var b strings.Builder
	fenced := false
	for l := range strings.SplitSeq(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(inlineCode.ReplaceAllString(l, "``"))
			b.WriteByte('\n')
		}
	}
	return b.String()
}

var inlineCode = regexp.MustCompile("`[^`]*`")

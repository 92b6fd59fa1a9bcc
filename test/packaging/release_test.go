package packaging

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// packagedUnit is deploy/podgate.service as the packages ship it: ExecStart=/usr/bin/podgate.
func packagedUnit(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "podgate.service"))
	if err != nil {
		t.Fatal(err)
	}
	unit := strings.Replace(string(b), "\nExecStart=/usr/local/bin/podgate ", "\nExecStart=/usr/bin/podgate ", 1)
	if !strings.Contains(unit, "\nExecStart=/usr/bin/podgate --config /etc/podgate/config.yaml\n") ||
		!strings.Contains(unit, "\nType=notify\n") || !strings.Contains(unit, "\nBefore=kubelet.service\n") {
		t.Fatalf("deploy/podgate.service: want Type=notify, Before=kubelet.service and ExecStart=/usr/local/bin/podgate --config /etc/podgate/config.yaml:\n%s", b)
	}
	return unit
}

// packagedFiles are the files of the packages, path → content, as the repository has them; the
// binary is left out (nil).
func packagedFiles(t testing.TB, unitDir string) map[string][]byte {
	t.Helper()
	root := repoRoot(t)
	read := func(p string) []byte {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	files := map[string][]byte{
		"/usr/bin/podgate":                               nil,
		unitDir + "/podgate.service":                     []byte(packagedUnit(t)),
		"/etc/podgate/config.yaml":                       read("deploy/config.yaml"),
		"/etc/kubernetes/kubelet.conf.d/50-podgate.conf": read("deploy/kubelet-podgate.conf"),
		"/usr/share/doc/podgate/README.md":               read("README.md"),
	}
	docs, err := os.ReadDir(filepath.Join(root, "docs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range docs {
		if !d.IsDir() {
			files["/usr/share/doc/podgate/docs/"+d.Name()] = read(filepath.Join("docs", d.Name()))
		}
	}
	monitoring, err := filepath.Glob(filepath.Join(root, "deploy", "monitoring", "podgate-*"))
	if err != nil || len(monitoring) < 3 {
		t.Fatalf("deploy/monitoring: %d rule files and dashboards (%v), want the alerts, the recording rules and the dashboard", len(monitoring), err)
	}
	for _, m := range monitoring {
		files["/usr/share/podgate/monitoring/"+filepath.Base(m)] = read(filepath.Join("deploy", "monitoring", filepath.Base(m)))
	}
	return files
}

// conffiles are the packages' configuration files: kept across upgrades.
var conffiles = []string{"/etc/kubernetes/kubelet.conf.d/50-podgate.conf", "/etc/podgate/config.yaml"}

// TestReleaseFiles: make release writes a static binary per architecture, its SBOM, a .deb
// and an .rpm per architecture, and SHA256SUMS naming each of them with its digest.
func TestReleaseFiles(t *testing.T) {
	dir := makeRelease(t, oldVersion)
	var want []string
	for _, arch := range arches {
		want = append(want, "podgate-linux-"+arch, "podgate-linux-"+arch+".cdx.json",
			filepath.Base(debFile(dir, oldVersion, arch)), filepath.Base(rpmFile(dir, oldVersion, arch)))
		bin := filepath.Join(dir, "podgate-linux-"+arch)
		info := run(t, "go", "version", "-m", bin)
		for _, w := range []string{"\tbuild\tCGO_ENABLED=0\n", "\tbuild\tGOARCH=" + arch + "\n", "\tbuild\t-trimpath=true\n"} {
			if !strings.Contains(info, w) {
				t.Errorf("%s: go version -m lacks %q:\n%s", bin, w, info)
			}
		}
		// -trimpath leaves -ldflags out of the build info: the binary says its version itself.
		if arch == runtime.GOARCH {
			if out := run(t, bin, "version"); !strings.HasPrefix(out, "podgate "+oldVersion+"\ncommit: ") {
				t.Errorf("%s version:\n%s\nwant podgate %s first", bin, out, oldVersion)
			}
		}
	}
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]string{}
	for _, l := range lines(string(sums)) {
		sum, name, ok := strings.Cut(l, "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS line %q is not sha256sum's \"DIGEST  NAME\"", l)
		}
		listed[name] = sum
	}
	if got := slices.Sorted(maps.Keys(listed)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("SHA256SUMS lists %v, want %v", got, slices.Sorted(slices.Values(want)))
	}
	for name, sum := range listed {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if d := sha256.Sum256(b); hex.EncodeToString(d[:]) != sum {
			t.Errorf("SHA256SUMS: %s is %s, the file's digest is %x", name, sum, d)
		}
	}
}

// cdxBOM is the part of a CycloneDX JSON document the SBOM test reads.
type cdxBOM struct {
	BOMFormat   string `json:"bomFormat"`
	SpecVersion string `json:"specVersion"`
	Metadata    struct {
		Component cdxComponent `json:"component"`
	} `json:"metadata"`
	Components []cdxComponent `json:"components"`
}

type cdxComponent struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	PURL    string `json:"purl"`
}

// TestSBOMNamesTheBinaryModules: each architecture's SBOM names the main module at the
// release's version and, as components, exactly the modules `go version -m` reports for that
// binary, each at its version (the replacement's, where go.mod replaces one).
func TestSBOMNamesTheBinaryModules(t *testing.T) {
	dir := makeRelease(t, oldVersion)
	for _, arch := range arches {
		bin := filepath.Join(dir, "podgate-linux-"+arch)
		want := map[string]string{} // module path → version
		var last string
		for _, l := range strings.Split(run(t, "go", "version", "-m", bin), "\n") {
			f := strings.Split(strings.TrimSpace(l), "\t")
			switch {
			case len(f) >= 3 && f[0] == "dep":
				last = f[1]
				want[f[1]] = f[2]
			case len(f) >= 3 && f[0] == "=>":
				delete(want, last)
				want[f[1]] = f[2]
			}
		}
		if len(want) < 20 {
			t.Fatalf("%s: go version -m reports %d modules, want podgate's dependencies", bin, len(want))
		}
		b, err := os.ReadFile(bin + ".cdx.json")
		if err != nil {
			t.Fatal(err)
		}
		var bom cdxBOM
		if err := json.Unmarshal(b, &bom); err != nil {
			t.Fatalf("%s.cdx.json: %v", bin, err)
		}
		if bom.BOMFormat != "CycloneDX" || bom.SpecVersion == "" {
			t.Errorf("%s.cdx.json: bomFormat %q specVersion %q, want a CycloneDX document", bin, bom.BOMFormat, bom.SpecVersion)
		}
		if m := bom.Metadata.Component; m.Name != "github.com/podgate/podgate" || m.Version != oldVersion {
			t.Errorf("%s.cdx.json: main component %s %s, want github.com/podgate/podgate %s", bin, m.Name, m.Version, oldVersion)
		}
		got := map[string]string{}
		for _, c := range bom.Components {
			got[c.Name] = c.Version
			if wantPURL := "pkg:golang/" + c.Name + "@" + c.Version; !strings.HasPrefix(c.PURL, wantPURL) {
				t.Errorf("%s.cdx.json: component %s purl %q, want %s...", bin, c.Name, c.PURL, wantPURL)
			}
		}
		for _, m := range slices.Sorted(maps.Keys(want)) {
			if got[m] != want[m] {
				t.Errorf("%s.cdx.json: %s at %q, go version -m says %s", bin, m, got[m], want[m])
			}
		}
		for _, m := range slices.Sorted(maps.Keys(got)) {
			if _, ok := want[m]; !ok {
				t.Errorf("%s.cdx.json: component %s %s is not in go version -m", bin, m, got[m])
			}
		}
	}
}

// TestDebContents: each .deb holds exactly the packaged files, with their modes and the
// repository's contents, marks the config and the kubelet drop-in as conffiles, and carries
// deploy/package/deb's maintainer scripts.
func TestDebContents(t *testing.T) {
	if _, err := exec.LookPath("dpkg-deb"); err != nil {
		t.Skip("dpkg-deb is not installed")
	}
	dir := makeRelease(t, oldVersion)
	want := packagedFiles(t, "/lib/systemd/system")
	for _, arch := range arches {
		deb := debFile(dir, oldVersion, arch)
		if got := run(t, "dpkg-deb", "--field", deb, "Package", "Version", "Architecture"); got != "Package: podgate\nVersion: 0.0.1-1\nArchitecture: "+arch+"\n" {
			t.Errorf("%s: control fields\n%s", deb, got)
		}
		got := debFiles(t, deb)
		if g, w := slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)); !slices.Equal(g, w) {
			t.Errorf("%s: files %v, want %v", deb, g, w)
		}
		for p, f := range got {
			wantMode := fs.FileMode(0o644)
			if p == "/usr/bin/podgate" {
				wantMode = 0o755
			}
			if f.mode != wantMode {
				t.Errorf("%s: %s mode %v, want %v", deb, p, f.mode, wantMode)
			}
			if w, ok := want[p]; ok && w != nil && !bytes.Equal(f.body, w) {
				t.Errorf("%s: %s differs from the repository's:\n%s", deb, p, f.body)
			}
		}
		if bin, err := os.ReadFile(filepath.Join(dir, "podgate-linux-"+arch)); err != nil || !bytes.Equal(got["/usr/bin/podgate"].body, bin) {
			t.Errorf("%s: /usr/bin/podgate is not podgate-linux-%s (%v)", deb, arch, err)
		}
		if c := lines(run(t, "dpkg-deb", "--info", deb, "conffiles")); !slices.Equal(slices.Sorted(slices.Values(c)), conffiles) {
			t.Errorf("%s: conffiles %v, want %v", deb, c, conffiles)
		}
		for _, s := range []string{"postinst", "prerm", "postrm"} {
			w, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "package", "deb", s))
			if err != nil {
				t.Fatal(err)
			}
			if got := run(t, "dpkg-deb", "--info", deb, s); got != string(w) {
				t.Errorf("%s: %s is not deploy/package/deb/%s:\n%s", deb, s, s, got)
			}
			kubeletUntouched(t, deb+" "+s, string(w))
		}
	}
}

type debEntry struct {
	mode fs.FileMode
	body []byte
}

// debFiles reads the regular files of a .deb's data archive.
func debFiles(t testing.TB, deb string) map[string]debEntry {
	t.Helper()
	tarball, err := exec.CommandContext(context.Background(), "dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		t.Fatalf("dpkg-deb --fsys-tarfile %s: %v", deb, err)
	}
	files := map[string]debEntry{}
	tr := tar.NewReader(bytes.NewReader(tarball))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files
		}
		if err != nil {
			t.Fatalf("%s: %v", deb, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(h.Name, ".")] = debEntry{mode: h.FileInfo().Mode().Perm(), body: body}
	}
}

// serviceCommand matches a script line that acts on a unit.
var serviceCommand = regexp.MustCompile(`^\s*(systemctl|deb-systemd-invoke|deb-systemd-helper|service|invoke-rc\.d)\b`)

// kubeletUntouched fails when a maintainer script acts on the kubelet: it never restarts
// (or stops, or starts) the kubelet by surprise.
func kubeletUntouched(t testing.TB, what, script string) {
	t.Helper()
	for _, l := range strings.Split(script, "\n") {
		if serviceCommand.MatchString(l) && strings.Contains(l, "kubelet") {
			t.Errorf("%s acts on the kubelet: %q", what, l)
		}
	}
}

// TestRPMContents: each .rpm lists exactly the packaged files (rpm -qlp), marks the two
// conffiles as configuration (rpm -qcp), and carries deploy/package/rpm's scripts (rpm -qp
// --scripts), none of which acts on the kubelet.
func TestRPMContents(t *testing.T) {
	if _, err := exec.LookPath("rpm"); err != nil {
		t.Skip("rpm is not installed (Debian's rpm package: make rig installs it)")
	}
	dir := makeRelease(t, oldVersion)
	want := slices.Sorted(maps.Keys(packagedFiles(t, "/usr/lib/systemd/system")))
	scriptlets := map[string]string{"post": "postinstall", "preun": "preuninstall", "postun": "postuninstall"}
	for _, arch := range arches {
		rpm := rpmFile(dir, oldVersion, arch)
		if got := run(t, "rpm", "-qp", "--queryformat", "%{NAME} %{VERSION} %{RELEASE} %{ARCH}", rpm); got != "podgate 0.0.1 1 "+rpmArch[arch] {
			t.Errorf("%s: %q, want podgate 0.0.1 1 %s", rpm, got, rpmArch[arch])
		}
		if got := slices.Sorted(slices.Values(lines(run(t, "rpm", "-qlp", rpm)))); !slices.Equal(got, want) {
			t.Errorf("rpm -qlp %s:\n%v\nwant\n%v", rpm, got, want)
		}
		if got := lines(run(t, "rpm", "-qcp", rpm)); !slices.Equal(slices.Sorted(slices.Values(got)), conffiles) {
			t.Errorf("rpm -qcp %s: %v, want %v", rpm, got, conffiles)
		}
		scripts := rpmScriptlets(run(t, "rpm", "-qp", "--scripts", rpm))
		if len(scripts) != len(scriptlets) {
			t.Errorf("rpm -qp --scripts %s: scriptlets %v, want %v", rpm, slices.Sorted(maps.Keys(scripts)), slices.Sorted(maps.Values(scriptlets)))
		}
		for file, name := range scriptlets {
			w, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "package", "rpm", file))
			if err != nil {
				t.Fatal(err)
			}
			body, ok := scripts[name]
			if !ok {
				t.Errorf("%s: no %s scriptlet", rpm, name)
				continue
			}
			for _, l := range strings.Split(string(w), "\n") {
				if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#!") && !strings.Contains(body, l) {
					t.Errorf("%s: %s scriptlet lacks deploy/package/rpm/%s's line %q:\n%s", rpm, name, file, l, body)
				}
			}
			kubeletUntouched(t, rpm+" "+name, body)
		}
	}
}

var scriptletHeader = regexp.MustCompile(`(?m)^(\w+) scriptlet \(using [^)]*\):$`)

// rpmScriptlets splits rpm --scripts' output into scriptlets by name (postinstall, ...).
func rpmScriptlets(out string) map[string]string {
	s := map[string]string{}
	idx := scriptletHeader.FindAllStringSubmatchIndex(out, -1)
	for i, m := range idx {
		end := len(out)
		if i+1 < len(idx) {
			end = idx[i+1][0]
		}
		s[out[m[2]:m[3]]] = out[m[1]:end]
	}
	return s
}

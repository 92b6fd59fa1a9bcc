package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// buildInfo is what `podgate version` prints: which build runs on a node, for a bug report or
// to match the binary against a release's SHA256SUMS and SBOM.
type buildInfo struct {
	// Version is -ldflags "-X main.version=..." (make build stamps `git describe`), else the
	// module version `go install ...@vX` records, else "dev".
	Version string
	// Commit is the VCS revision go build stamps (vcs.revision), with "-dirty" when the tree
	// had uncommitted changes; else main.commit; "unknown" when the build has neither (go test).
	Commit string
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// commit is set at build time with -ldflags "-X main.commit=..." (make build does): the
// revision when go build stamps none, as from a git worktree (whose .git is a file go build does
// not look into) or with GOFLAGS=-buildvcs=false.
var commit = ""

// readBuildInfo reads the binary's build information; stamped is main.version, stampedCommit
// main.commit.
func readBuildInfo(stamped, stampedCommit string, read func() (*debug.BuildInfo, bool)) buildInfo {
	b := buildInfo{Version: stamped, Commit: "unknown", GoVersion: runtime.Version()}
	if stampedCommit != "" {
		b.Commit = stampedCommit
	}
	bi, ok := read()
	if !ok {
		return b
	}
	if bi.GoVersion != "" {
		b.GoVersion = bi.GoVersion
	}
	if b.Version == "dev" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	var revision, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value
		}
	}
	if revision != "" {
		b.Commit = revision
		if modified == "true" {
			b.Commit += "-dirty"
		}
	}
	return b
}

// String is the version's text: the first line as podgate always printed it, then the commit
// and the toolchain.
func (b buildInfo) String() string {
	return fmt.Sprintf("podgate %s\ncommit: %s\ngo: %s\n", b.Version, b.Commit, b.GoVersion)
}

// binaryVersion is this binary's version, as the metrics' build_info and the logs report it.
func binaryVersion() string {
	return readBuildInfo(version, commit, debug.ReadBuildInfo).Version
}

// versionText is what `podgate version` and `podgate --version` print.
func versionText() string {
	return readBuildInfo(version, commit, debug.ReadBuildInfo).String()
}

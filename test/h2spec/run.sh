#!/usr/bin/env bash
# h2spec v2.2.1, patched by grpc.patch to send gRPC-shaped requests (POST, content-type
# application/grpc, te: trailers, the path of a real CRI method), against podgate's CRI socket
# (podgate in front of test/e2e/fakeruntime) and against that grpc-go server, side by side.
# The module's source is fetched with the Go module proxy into a cache outside the checkout
# (PODGATE_H2SPEC_CACHE, default ~/.cache/podgate-h2spec), copied, patched and built there
# once. Arguments go to test/hostile (-path). Run as root (podgate runs as root): make h2spec
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
go=${GO:-go}
cache=${PODGATE_H2SPEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/podgate-h2spec}
# h2spec has no go.mod: its v2 tags are +incompatible versions to the module proxy.
version=v2.2.1+incompatible
bin=$cache/h2spec-v2.2.1-grpc
mkdir -p "$cache"
if [[ ! -x $bin || $root/test/h2spec/grpc.patch -nt $bin ]]; then
	src=$(cd "$cache" && GO111MODULE=on GOFLAGS= "$go" mod download -json "github.com/summerwind/h2spec@$version" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z $src ]]; then
		echo "h2spec: github.com/summerwind/h2spec@$version could not be fetched" >&2
		exit 1
	fi
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	cp -r "$src/." "$work"
	chmod -R u+w "$work"
	patch -d "$work" -p1 <"$root/test/h2spec/grpc.patch"
	# Its dependencies at the versions of its Gopkg.lock; x/net at podgate's own.
	cat >"$work/go.mod" <<EOF
module github.com/summerwind/h2spec

go 1.21

require (
	github.com/fatih/color v1.7.0
	github.com/inconshreveable/mousetrap v1.0.0
	github.com/mattn/go-colorable v0.1.0
	github.com/mattn/go-isatty v0.0.4
	github.com/spf13/cobra v0.0.3
	github.com/spf13/pflag v1.0.3
	golang.org/x/net $(cd "$root" && "$go" list -m -f '{{.Version}}' golang.org/x/net)
)
EOF
	(cd "$work" && GOFLAGS=-mod=mod "$go" build -o "$bin" ./cmd/h2spec)
fi
cd "$root"
exec "$go" run ./test/hostile -h2spec "$bin" "$@"

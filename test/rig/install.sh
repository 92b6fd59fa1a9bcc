#!/usr/bin/env bash
# install.sh [PART...]: install or build everything a real node has, for podgate's end-to-end
# tests and demo. The parts:
#
#   node           containerd v2.4.x + containerd-shim-runc-v2 + ctr   (built from the Go module proxy)
#                  runc v1.5.x with seccomp                            (built; Debian's 1.1.5 fails under containerd 2.x)
#                  CNI plugins                                         (Debian containernetworking-plugins, /usr/lib/cni)
#                  a pause image and a busybox image                   (built locally: no registry is reachable)
#   control-plane  etcd and kube-apiserver                             (built by test/cluster/build.sh)
#   cluster        etcd, kube-apiserver and kubelet                    (the same, for the single-node
#                                                                       Kubernetes of test/cluster)
#   tools          crictl v1.36.x                                      (built; README "Debugging", test/e2e)
#                  grpcurl v1.9.x                                      (built; README "PodResources", test/e2e)
#
# No PART means all of them (make rig, make test); make demo asks for node and control-plane.
# The Debian packages every part needs are installed first.
#
# Everything lands in $PODGATE_RIG_DIR (default /var/lib/podgate-rig). Idempotent: what is
# already there at the wanted version is reused. Needs root (apt-get).
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.36.0}
GRPCURL_VERSION=${GRPCURL_VERSION:-v1.9.4}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
export PATH=/usr/local/go/bin:$PATH

log() { printf 'rig: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root (apt-get, containerd)"
	exit 1
fi

PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(node cluster tools)
part() {
	local p
	for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done
	return 1
}
for p in "${PARTS[@]}"; do
	case $p in
	node | control-plane | cluster | tools) ;;
	*)
		log "unknown part $p: want some of node control-plane cluster tools"
		exit 2
		;;
	esac
done

mkdir -p "$RIG_DIR/bin" "$RIG_DIR/images"

# gcc: runc is built with cgo (seccomp). util-linux: findmnt, used by down.sh.
apt_packages=(gcc libc6-dev libseccomp-dev pkg-config containernetworking-plugins busybox-static iproute2 iptables util-linux)
missing=()
for p in "${apt_packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "apt-get install ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# built_at BIN VERSION: true when bin/BIN was built from its module at VERSION. `go install
# pkg@version` records the main module's version in the binary, so a build made by hand (or by an
# interrupted earlier run) is recognised too, and no separate stamp file can go stale.
built_at() {
	[ -x "$RIG_DIR/bin/$1" ] &&
		[ "$(go version -m "$RIG_DIR/bin/$1" 2>/dev/null | awk '$1 == "mod" { print $3; exit }')" = "$2" ]
}

if part node; then
	if ! built_at containerd "$CONTAINERD_VERSION" || ! built_at containerd-shim-runc-v2 "$CONTAINERD_VERSION" || ! built_at ctr "$CONTAINERD_VERSION"; then
		log "building containerd $CONTAINERD_VERSION (about 2 minutes)"
		GOBIN="$RIG_DIR/bin" go install \
			"github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
			"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
			"github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
	fi

	if ! built_at runc "$RUNC_VERSION"; then
		log "building runc $RUNC_VERSION"
		CGO_ENABLED=1 GOBIN="$RIG_DIR/bin" go install -tags seccomp "github.com/opencontainers/runc@$RUNC_VERSION"
	fi

	# Images are rebuilt when the builder's source changes.
	img_src_sum=$(cat "$HERE/mkimages/"*.go | sha256sum | cut -c1-16)
	if [ "$(cat "$RIG_DIR/images/.version" 2>/dev/null)" != "$img_src_sum" ] || [ ! -s "$RIG_DIR/images/pause.tar" ] || [ ! -s "$RIG_DIR/images/busybox.tar" ]; then
		log "building pause and busybox images"
		(cd "$REPO" && go run ./test/rig/mkimages -out "$RIG_DIR/images" -busybox /bin/busybox)
		echo "$img_src_sum" >"$RIG_DIR/images/.version"
	fi
fi

if part tools; then
	if ! built_at crictl "$CRICTL_VERSION"; then
		log "building crictl $CRICTL_VERSION"
		# `go install pkg@version` also reads the module's version list (for deprecation notices),
		# which some module proxies refuse. `go mod download` writes that list into the module
		# cache, which then serves as the first proxy; everything else falls through to GOPROXY.
		# (Run outside any module, so that no go.mod or go.sum is touched.)
		(cd / && go mod download "sigs.k8s.io/cri-tools@$CRICTL_VERSION")
		GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" GOBIN="$RIG_DIR/bin" \
			go install "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
	fi

	if ! built_at grpcurl "$GRPCURL_VERSION"; then
		log "building grpcurl $GRPCURL_VERSION"
		(cd / && go mod download "github.com/fullstorydev/grpcurl@$GRPCURL_VERSION")
		GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" GOBIN="$RIG_DIR/bin" \
			go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
	fi
fi

# The single-node Kubernetes of test/cluster (about 5 minutes on 2 cores the first time; reused
# after that), or its control plane alone. PODGATE_RIG_DIR is passed on: build.sh puts the
# binaries in $RIG_DIR/cluster/bin.
if part cluster; then
	PODGATE_RIG_DIR=$RIG_DIR bash "$REPO/test/cluster/build.sh"
elif part control-plane; then
	PODGATE_RIG_DIR=$RIG_DIR bash "$REPO/test/cluster/build.sh" etcd kube-apiserver
fi

log "ready in $RIG_DIR: ${PARTS[*]}"

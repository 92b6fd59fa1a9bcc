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
#                  grpcurl v1.9.x                                      (built; docs/podresources.md, test/e2e)
#                  critest, of crictl's release                        (built; test/e2e BenchmarkCritest)
#                  rpm, systemd, init-system-helpers                   (Debian; test/packaging)
#                  prometheus: promtool and the server                 (Debian; deploy/monitoring, test/e2e)
#   skew           the oldest containerd and kubelet of the tested     (built; make test's skew lane)
#                  matrix (test/matrix/versions.env)
#   matrix         every containerd and kubelet of the matrix          (built; make matrix)
#   neighbours     multus (thin plugin), dra-example-driver's kubelet  (built from the Go module proxy
#                  plugin and dranet, at test/rig/neighbours.env's     in copies of their modules; about
#                  versions, into neighbours/bin (test/cluster)         15 CPU-minutes the first time)
#   vm             the VM lane's Debian 12 node image with systemd,     (Debian's qemu, debootstrap and
#                  cgroup v2 and the rig's binaries (test/vm)          kernel; needs node, tools, cluster)
#
# A containerd of the matrix lands in $RIG_DIR/containerd/VERSION, a kubelet in
# $RIG_DIR/cluster/kubelet/VERSION; the default (newest) ones are links to bin/ and cluster/bin/.
# No PART means node, cluster, tools, neighbours and skew (make rig, make test); make demo asks for node and
# control-plane.
# The Debian packages every part needs are installed first.
#
# Everything lands in $PODGATE_RIG_DIR (default /var/lib/podgate-rig). Idempotent: what is
# already there at the wanted version is reused. Needs root (apt-get).
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../matrix/versions.env
. "$HERE/../matrix/versions.env"
read -r -a CONTAINERDS <<<"$CONTAINERD_VERSIONS"
read -r -a KUBELETS <<<"$KUBELET_VERSIONS"
CONTAINERD_VERSION=${CONTAINERDS[-1]} # the newest: the default of every test
RUNC_VERSION=${RUNC_VERSION:-v1.5.2}
CRICTL_VERSION=${CRICTL_VERSION:-v1.36.0}
GRPCURL_VERSION=${GRPCURL_VERSION:-v1.9.4}
REPO=$(cd "$HERE/../.." && pwd)
export PATH=/usr/local/go/bin:$PATH

log() { printf 'rig: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root (apt-get, containerd)"
	exit 1
fi

PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(node cluster tools neighbours skew)
part() {
	local p
	for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done
	return 1
}
for p in "${PARTS[@]}"; do
	case $p in
	node | control-plane | cluster | tools | neighbours | skew | matrix | vm) ;;
	*)
		log "unknown part $p: want some of node control-plane cluster tools neighbours skew matrix vm"
		exit 2
		;;
	esac
done

mkdir -p "$RIG_DIR/bin" "$RIG_DIR/images"

# gcc: runc is built with cgo (seccomp). util-linux: findmnt, used by down.sh. For the package
# tests (test/packaging; tools, a part of make test's rig): rpm (rpm -qlp, rpm -qp --scripts),
# systemd (systemd-analyze verify of the installed unit), init-system-helpers
# (deb-systemd-helper, which the .deb's maintainer scripts call).
apt_packages=(gcc libc6-dev libseccomp-dev pkg-config containernetworking-plugins busybox-static iproute2 iptables util-linux)
if part tools; then
	apt_packages+=(rpm systemd init-system-helpers)
fi
missing=()
for p in "${apt_packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "apt-get install ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# prometheus (tools part): promtool and the Prometheus server for the monitoring tests
# (deploy/monitoring; test/e2e starts its own server on loopback). Without its recommended node
# exporter; where systemd runs, the package's own service is stopped and disabled: the tests
# need the binaries, not a server on :9090.
if part tools && ! dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q 'install ok installed'; then
	log "apt-get install prometheus"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
	if [ -d /run/systemd/system ]; then
		systemctl disable --now prometheus.service >/dev/null 2>&1 || true
	fi
fi

# built_at BIN VERSION: true when bin/BIN was built from its module at VERSION. `go install
# pkg@version` records the main module's version in the binary, so a build made by hand (or by an
# interrupted earlier run) is recognised too, and no separate stamp file can go stale.
built_at() { built_in "$RIG_DIR/bin" "$@"; }
built_in() {
	[ -x "$1/$2" ] &&
		[ "$(go version -m "$1/$2" 2>/dev/null | awk '$1 == "mod" { print $3; exit }')" = "$3" ]
}

# build_containerd VERSION DIR: build containerd, its runc shim and ctr at VERSION into DIR, unless there.
build_containerd() {
	local b
	for b in containerd containerd-shim-runc-v2 ctr; do
		built_in "$2" "$b" "$1" || {
			log "building containerd $1 (about 2 minutes)"
			GOBIN="$2" go install \
				"github.com/containerd/containerd/v2/cmd/containerd@$1" \
				"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$1" \
				"github.com/containerd/containerd/v2/cmd/ctr@$1"
			return
		}
	done
}

# build_neighbour MODULE VERSION BIN PKG: build PKG of MODULE at VERSION into neighbours/bin/BIN,
# unless the stamp neighbours/bin/.BIN says it was built from MODULE@VERSION.
build_neighbour() {
	local bin=$RIG_DIR/neighbours/bin src work
	[ -x "$bin/$3" ] && [ "$(cat "$bin/.$3" 2>/dev/null)" = "$1@$2" ] && return
	log "building $3 from $1@$2"
	mkdir -p "$bin"
	src=$(cd / && go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -d "$src" ] || { log "$1@$2: module not downloaded"; exit 1; }
	work=$(mktemp -d)
	cp -r "$src" "$work/m"
	chmod -R u+w "$work/m"
	(cd "$work/m" && go build -trimpath -o "$bin/$3" "./$4")
	rm -rf "$work"
	echo "$1@$2" >"$bin/.$3"
}

# matrix_containerd VERSION: containerd VERSION of the matrix in $RIG_DIR/containerd/VERSION; the
# default one is a link to bin/, built by the node part.
matrix_containerd() {
	mkdir -p "$RIG_DIR/containerd"
	if [ "$1" = "$CONTAINERD_VERSION" ]; then
		ln -sfn ../bin "$RIG_DIR/containerd/$1"
	else
		build_containerd "$1" "$RIG_DIR/containerd/$1"
	fi
}

if part node; then
	build_containerd "$CONTAINERD_VERSION" "$RIG_DIR/bin"
	matrix_containerd "$CONTAINERD_VERSION"

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

	# critest is a Go test binary (go test -c), built in a writable copy of the cri-tools module,
	# which vendors its dependencies; its version is kept beside it, as go version -m cannot say it.
	if [ ! -x "$RIG_DIR/bin/critest" ] || [ "$(cat "$RIG_DIR/bin/.critest-version" 2>/dev/null)" != "$CRICTL_VERSION" ]; then
		log "building critest $CRICTL_VERSION"
		src=$(cd / && go mod download -json "sigs.k8s.io/cri-tools@$CRICTL_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[ -d "$src" ] || { log "cri-tools $CRICTL_VERSION: module not downloaded"; exit 1; }
		work=$(mktemp -d)
		cp -r "$src" "$work/cri-tools"
		chmod -R u+w "$work/cri-tools"
		(cd "$work/cri-tools" && go test -c -o "$RIG_DIR/bin/critest" ./cmd/critest)
		rm -rf "$work"
		echo "$CRICTL_VERSION" >"$RIG_DIR/bin/.critest-version"
	fi

	if ! built_at grpcurl "$GRPCURL_VERSION"; then
		log "building grpcurl $GRPCURL_VERSION"
		(cd / && go mod download "github.com/fullstorydev/grpcurl@$GRPCURL_VERSION")
		GOPROXY="file://$(go env GOMODCACHE)/cache/download,$(go env GOPROXY)" GOBIN="$RIG_DIR/bin" \
			go install "github.com/fullstorydev/grpcurl/cmd/grpcurl@$GRPCURL_VERSION"
	fi
fi

# The neighbours (test/rig/neighbours.env): programs nobody here wrote, which podgate's real-stack
# tests run beside it. Each is built inside a writable copy of its own module, so that its own
# go.mod and go.sum decide every dependency (as its release does) and no version list is asked
# for (the module proxy refuses those: `go install mod@version` fails at "loading deprecation").
# A stamp beside the binaries says which module@version they came from.
if part neighbours; then
	# shellcheck source=neighbours.env
	. "$HERE/neighbours.env"
	build_neighbour gopkg.in/k8snetworkplumbingwg/multus-cni.v4 "$MULTUS_VERSION" multus cmd/multus
	build_neighbour sigs.k8s.io/dra-example-driver "$DRA_EXAMPLE_DRIVER_VERSION" dra-example-kubeletplugin cmd/dra-example-kubeletplugin
	build_neighbour sigs.k8s.io/dranet "$DRANET_VERSION" dranet cmd/dranet
fi

# The single-node Kubernetes of test/cluster (about 5 minutes on 2 cores the first time; reused
# after that), or its control plane alone. PODGATE_RIG_DIR is passed on: build.sh puts the
# binaries in $RIG_DIR/cluster/bin.
if part cluster; then
	PODGATE_RIG_DIR=$RIG_DIR bash "$REPO/test/cluster/build.sh"
	mkdir -p "$RIG_DIR/cluster/kubelet"
	ln -sfn ../bin "$RIG_DIR/cluster/kubelet/${KUBELETS[-1]}"
elif part control-plane; then
	PODGATE_RIG_DIR=$RIG_DIR bash "$REPO/test/cluster/build.sh" etcd kube-apiserver
fi

# The other cells of the matrix: the oldest pair for make test's skew lane, or every release.
older=()
if part matrix; then
	older=("${CONTAINERDS[@]:0:${#CONTAINERDS[@]}-1}")
	kubelets=("${KUBELETS[@]:0:${#KUBELETS[@]}-1}")
elif part skew; then
	older=("${CONTAINERDS[0]}")
	kubelets=("${KUBELETS[0]}")
fi
for v in "${older[@]}"; do
	matrix_containerd "$v"
done
if [ ${#older[@]} -gt 0 ]; then
	PODGATE_RIG_DIR=$RIG_DIR bash "$REPO/test/cluster/build.sh" "${kubelets[@]/#/kubelet@}"
fi

# The VM lane's node image (make vm-test): after the parts whose binaries it copies in.
if part vm; then
	PODGATE_RIG_DIR=$RIG_DIR bash "$REPO/test/vm/install.sh"
fi

log "ready in $RIG_DIR: ${PARTS[*]}"

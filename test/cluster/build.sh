#!/usr/bin/env bash
# build.sh [BINARY...]: build the binaries of test/cluster's single-node Kubernetes from the Go
# module proxy:
#
#   etcd             go.etcd.io/etcd/server/v3 $ETCD_VERSION           (wrapper module etcd/)
#   kube-apiserver   k8s.io/kubernetes/cmd/kube-apiserver $K8S_VERSION (wrapper k8s/$K8S_VERSION/)
#   kubelet          k8s.io/kubernetes/cmd/kubelet $K8S_VERSION
#   kubelet@VERSION  the kubelet of another release of the tested matrix (wrapper k8s/VERSION/)
#
# into $PODGATE_RIG_DIR/cluster/bin (default /var/lib/podgate-rig/cluster/bin), a kubelet@VERSION
# into cluster/kubelet/VERSION/: the BINARYs named, etcd, kube-apiserver and kubelet by default
# (`build.sh etcd kube-apiserver` is the control plane alone, what `make demo` uses). K8S_VERSION
# is the newest release of the matrix: the control plane is always that one, and the kubelets of
# older releases join it (a kubelet may be up to three minor releases older than its API server).
# Idempotent: a binary whose build information names the wanted module version and the stamp of
# the wrapper's go.mod/go.sum and build settings is reused (see stamp), so the kubelet built
# later reuses the control plane built first. test/rig/install.sh runs it; it needs no root
# itself. A first build of all three takes about 12 CPU-minutes: 6-7 minutes on two cores; each
# older kubelet about 5 more.
# The versions live in the wrapper modules' go.mod files (update.sh generates them); the ones
# below only tell build.sh what a correct binary contains.
set -euo pipefail

K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.8
RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
BIN=$RIG_DIR/cluster/bin
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH=/usr/local/go/bin:$PATH
# The wrappers' go.sum is authoritative: never let a build edit it. -buildvcs=false keeps the
# podgate checkout's git state out of the binaries (the wrappers live inside it). No -trimpath:
# with it Go leaves -ldflags out of the build information, and the stamp below lives there.
export GOFLAGS="-mod=readonly -buildvcs=false"

log() { printf 'cluster: %s\n' "$*" >&2; }

# stamp WRAPPER RECIPE: a hash of the wrapper's go.mod and go.sum and of the build settings below.
# It goes to the linker as a -X flag for a variable that does not exist, which the linker ignores
# but `go version -m` lists among the build settings: each binary records what it was built
# from, and an edit of the wrapper or of its recipe triggers a rebuild.
stamp() { { cat "$HERE/$1/go.mod" "$HERE/$1/go.sum"; echo "$2"; } | sha256sum | cut -c1-16; }

OUT=$BIN # where build puts what it built

# built BIN MODULE VERSION STAMP: true when BIN was built from MODULE at VERSION by the wrapper
# whose dependency stamp is STAMP. `go version -m` reads the build information Go records in
# every binary, so no separate stamp file can go stale or outlive an interrupted build.
built() {
	local info
	[ -x "$1" ] || return 1
	info=$(go version -m "$1" 2>/dev/null) || return 1
	awk -v m="$2" -v v="$3" '$1 == "mod" && $2 == m && $3 == v { found = 1 } END { exit !found }' <<<"$info" &&
		grep -qF "podgate-cluster-stamp=$4" <<<"$info"
}

ALL=(etcd kube-apiserver kubelet)
WANT=("$@")
[ ${#WANT[@]} -gt 0 ] || WANT=("${ALL[@]}")
wants() {
	local w
	for w in "${WANT[@]}"; do [ "$w" = "$1" ] && return 0; done
	return 1
}
OLDER=() # the VERSIONs of the kubelet@VERSION asked for
for w in "${WANT[@]}"; do
	case $w in
	kubelet@v*)
		[ -f "$HERE/k8s/${w#kubelet@}/go.mod" ] || { log "no wrapper module k8s/${w#kubelet@}: run update.sh k8s ${w#kubelet@}"; exit 2; }
		OLDER+=("${w#kubelet@}")
		continue
		;;
	esac
	case " ${ALL[*]} " in
	*" $w "*) ;;
	*) log "unknown binary $w: want some of ${ALL[*]} kubelet@VERSION"; exit 2 ;;
	esac
done

mkdir -p "$BIN"

# build WRAPPER LDFLAGS NAME PACKAGE...: build the main packages into BIN, as NAME when there is
# one package, under their own names when NAME is empty. One `go build` for several
# packages compiles their shared dependencies once and links in parallel. The binaries are
# built in a temporary directory and moved into BIN at the end, so an interrupted build never
# leaves a binary that looks complete.
build() {
	local wrapper=$1 ldflags=$2 name=$3 tmp
	shift 3
	tmp=$(mktemp -d "$BIN/.build-XXXXXX")
	trap "rm -rf '$tmp'" EXIT
	(cd "$HERE/$wrapper" && go build -ldflags "$ldflags" -o "$tmp/$name" "$@")
	mkdir -p "$OUT"
	mv -f "$tmp"/* "$OUT/"
	rm -rf "$tmp"
	trap - EXIT
}

# etcd is built static, as etcd's own release build does.
etcd_recipe="CGO_ENABLED=0 -s -w"
etcd_stamp=$(stamp etcd "$etcd_recipe")
if wants etcd && ! built "$BIN/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$etcd_stamp"; then
	log "building etcd $ETCD_VERSION (about 1 minute)"
	start=$SECONDS
	CGO_ENABLED=0 build etcd "-s -w -X main.podgate-cluster-stamp=$etcd_stamp" etcd go.etcd.io/etcd/server/v3
	log "built etcd in $((SECONDS - start))s"
fi

# What kubernetes' own build (hack/lib/version.sh) stamps in: the apiserver and kubelet report
# this version (Node status, /version) instead of v0.0.0-master. Both are built with the same
# settings, in one go build when both are wanted, with cgo on, as kubernetes builds the kubelet;
# kubernetes builds kube-apiserver static, but a build with CGO_ENABLED=0 would compile nearly
# every shared package again (net and all that imports it depend on the setting) for no gain in
# a test. With the same settings, the kubelet built after the control plane reuses Go's build
# cache for the packages they share.

# k8s_ldflags VERSION: the flags kubernetes' own release build gives the linker for VERSION.
k8s_ldflags() {
	local minor=${1#v1.} flags="-s -w" pkg
	minor=${minor%%.*}
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	echo "$flags"
}

# build_k8s VERSION DIR BINARY...: build the BINARYs of Kubernetes VERSION into DIR, those not
# already there.
build_k8s() {
	local version=$1 dir=$2 ldflags stamp b pkgs=()
	shift 2
	ldflags=$(k8s_ldflags "$version")
	stamp=$(stamp "k8s/$version" "CGO_ENABLED=1 $ldflags")
	for b in "$@"; do
		built "$dir/$b" k8s.io/kubernetes "$version" "$stamp" || pkgs+=("k8s.io/kubernetes/cmd/$b")
	done
	[ ${#pkgs[@]} -gt 0 ] || return 0
	log "building ${pkgs[*]##*/} $version (both: about 5 minutes on 2 cores)"
	start=$SECONDS
	OUT=$dir CGO_ENABLED=1 build "k8s/$version" "$ldflags -X main.podgate-cluster-stamp=$stamp" "" "${pkgs[@]}"
	log "built ${pkgs[*]##*/} $version in $((SECONDS - start))s"
}

newest=()
for b in kube-apiserver kubelet; do
	wants "$b" && newest+=("$b")
done
[ ${#newest[@]} -eq 0 ] || build_k8s "$K8S_VERSION" "$BIN" "${newest[@]}"
for v in "${OLDER[@]}"; do
	build_k8s "$v" "$RIG_DIR/cluster/kubelet/$v" kubelet
done

log "ready in $BIN: ${WANT[*]} (etcd $ETCD_VERSION, Kubernetes $K8S_VERSION; older kubelets in $RIG_DIR/cluster/kubelet)"

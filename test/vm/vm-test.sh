#!/usr/bin/env bash
# vm-test.sh [OUT]: the VM lane (make vm-test; issue 41). Boots the node image of test/vm/install.sh
# once and runs scripts/node.sh inside: podgate's .deb installed with apt under systemd, a pod
# through podgate on the systemd cgroup driver, then (scripts/kubelet.sh) the kubelet with
# cgroupDriver: systemd through podgate, an upgrade to a newer package, a stop and start of
# podgate, memory QoS and drift, remove and purge. OUT (default _output/vm) receives the guest's
# results.txt, figures.txt, run.log, journal.txt and the serial console.
#
# The package: the newest bin/release/podgate_*_amd64.deb (make package PKG_ARCHES=amd64), and a
# copy of it with its Debian revision raised by one (dpkg-deb), the "newer package" of the
# upgrade. Exit status: the guest's (0 every check passed), 124 when the VM ran out of time.
#
# With the control plane's binaries installed (test/rig/install.sh cluster) and VM_API not 0,
# etcd and kube-apiserver run on the host's loopback for the run (test/vm/controlplane, which
# runs this script again inside it), the guest reaches kube-apiserver through qemu's forward
# (run.sh, VM_APISERVER_PORT), and scripts/api.sh runs: the kubelet registered, podgate's own
# memory QoS with the kubelet's off, in-place resizes.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/_output/vm}")

log() { printf 'vm-test: %s\n' "$*" >&2; }

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
if [ -z "${VM_APISERVER_PORT:-}" ] && [ "${VM_API:-1}" != 0 ] && [ -x "$RIG_DIR/cluster/bin/kube-apiserver" ] && [ -x "$RIG_DIR/cluster/bin/etcd" ]; then
	log "control plane on the host for the run (test/vm/controlplane)"
	cp_dir=$(mktemp -d /tmp/pgvm-XXXXXX)
	trap 'rm -rf "$cp_dir"' EXIT
	(cd "$REPO" && go build -o "$cp_dir/controlplane" ./test/vm/controlplane)
	status=0
	"$cp_dir/controlplane" -dir "$cp_dir/cluster" -- bash "${BASH_SOURCE[0]}" "$OUT" || status=$?
	cp "$cp_dir"/cluster/*.log "$OUT/" 2>/dev/null || true
	exit "$status"
fi

# The last-modified package (ls -t), the one make package just built.
deb=$(ls -t "$REPO"/bin/release/podgate_*_amd64.deb 2>/dev/null | head -1 || true)
[ -n "$deb" ] || {
	log "no bin/release/podgate_*_amd64.deb: make package PKG_ARCHES=amd64"
	exit 2
}
work=$(mktemp -d /tmp/podgate-vm-test.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The newer package: the same files, Debian revision + 1; its postinst try-restarts podgate as
# any upgrade's does.
dpkg-deb -R "$deb" "$work/pkg"
version=$(sed -n 's/^Version: //p' "$work/pkg/DEBIAN/control")
newer=${version%-*}-$((${version##*-} + 1))
sed -i "s/^Version: .*/Version: $newer/" "$work/pkg/DEBIAN/control"
cp "$deb" "$work/podgate_${version}_amd64.deb"
dpkg-deb -b "$work/pkg" "$work/podgate_${newer}_amd64.deb" >/dev/null
log "packages $version and $newer"

files=("$work/podgate_${version}_amd64.deb" "$work/podgate_${newer}_amd64.deb"
	"$HERE/scripts/kubelet.sh" "$HERE/scripts/removal.sh")
if [ -n "${VM_APISERVER_PORT:-}" ]; then
	# Inside test/vm/controlplane: the guest gets its kubeconfig and port.
	cp "$VM_KUBECONFIG" "$work/kubeconfig"
	echo "$VM_APISERVER_PORT" >"$work/apiserver-port"
	files+=("$HERE/scripts/api.sh" "$work/kubeconfig" "$work/apiserver-port")
fi

status=0
nice -n 19 bash "$HERE/run.sh" "$HERE/scripts/node.sh" "$OUT" "${files[@]}" || status=$?
if [ -s "$OUT/results.txt" ]; then
	cat "$OUT/results.txt"
	printf '%s passed, %s failed\n' "$(grep -c '^ok' "$OUT/results.txt")" "$(grep -c '^FAIL' "$OUT/results.txt")"
fi
[ ! -s "$OUT/figures.txt" ] || cat "$OUT/figures.txt"
exit "$status"

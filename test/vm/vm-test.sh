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
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
OUT=$(realpath -m "${1:-$REPO/_output/vm}")

log() { printf 'vm-test: %s\n' "$*" >&2; }

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

status=0
nice -n 19 bash "$HERE/run.sh" "$HERE/scripts/node.sh" "$OUT" \
	"$work/podgate_${version}_amd64.deb" "$work/podgate_${newer}_amd64.deb" \
	"$HERE/scripts/kubelet.sh" || status=$?
if [ -s "$OUT/results.txt" ]; then
	cat "$OUT/results.txt"
	printf '%s passed, %s failed\n' "$(grep -c '^ok' "$OUT/results.txt")" "$(grep -c '^FAIL' "$OUT/results.txt")"
fi
[ ! -s "$OUT/figures.txt" ] || cat "$OUT/figures.txt"
exit "$status"

#!/usr/bin/env bash
# run.sh all | skew | cell KUBELET CONTAINERD: run the core of the real-stack tests on cells of
# the tested version matrix (versions.env): `all` on every kubelet × containerd cell (make
# matrix), `skew` on the oldest pair alone (make test's skew lane; the default, newest pair runs
# every test in make test), `cell` on one pair (a cell that failed, run again).
#
# The core: a pod started through podgate with every stage on, sysctls, DRA before CNI with and
# beside the kubelet, governed pulls, PodResources, adoption and restart, and one test of each
# neighbour (multus, dra-example-driver, dranet; test/rig/neighbours.env) (CORE_CLUSTER and
# CORE_E2E below). Each cell runs them against its kubelet (test/cluster, under the newest
# control plane: a kubelet may be up to three minor releases older than its API server) and its
# containerd (test/cluster and test/e2e). Needs root and the rig: install.sh skew (or matrix)
# builds the older releases beside the default ones.
#
# Each cell's result goes to $PODGATE_RIG_DIR/matrix/<kubelet>_<containerd>.result and its go test
# output beside it; the table of the last results, the one the README's "Tested with" shows, is
# printed at the end and written to $PODGATE_RIG_DIR/matrix/tested-with.md. Exit status 1 when a
# cell failed.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
OUT=$RIG_DIR/matrix
export PATH=/usr/local/go/bin:$PATH
# shellcheck source=versions.env
. "$HERE/versions.env"
read -r -a KUBELETS <<<"$KUBELET_VERSIONS"
read -r -a CONTAINERDS <<<"$CONTAINERD_VERSIONS"

CORE_CLUSTER='^(TestPodThroughPodgate|TestAdoptAndRemoveOnALiveNode|TestPodgateRestartUnderTheKubelet|TestPullEvents|TestMultusDRAClaim|TestDRAExampleDriverKubelet|TestDRANetBesidePodgate)$'
CORE_E2E='^(TestPodLifecycleThroughPodgate|TestPodSysctlsThroughPodgate|TestDRAWithTheKubelet|TestDRAWithoutTheKubelet|TestImagePullGovernor|TestPodResourcesMetaCNI|TestRegistryRebuiltAfterPodgateRestart)$'

log() { printf 'matrix: %s\n' "$*" >&2; }

case ${1:-} in
all) cells=() ;;
skew) cells=("${KUBELETS[0]} ${CONTAINERDS[0]}") ;;
cell)
	[[ " $KUBELET_VERSIONS " == *" ${2:-none} "* && " $CONTAINERD_VERSIONS " == *" ${3:-none} "* ]] ||
		{ log "run.sh cell KUBELET CONTAINERD: want a kubelet of $KUBELET_VERSIONS and a containerd of $CONTAINERD_VERSIONS"; exit 2; }
	cells=("$2 $3")
	;;
*) log "usage: run.sh all | skew | cell KUBELET CONTAINERD"; exit 2 ;;
esac
if [ "$1" = all ]; then
	for k in "${KUBELETS[@]}"; do
		for c in "${CONTAINERDS[@]}"; do cells+=("$k $c"); done
	done
fi

mkdir -p "$OUT"
failed=0
for cell in "${cells[@]}"; do
	read -r kubelet containerd <<<"$cell"
	name=${kubelet}_${containerd}
	log "cell kubelet $kubelet × containerd $containerd"
	start=$SECONDS
	result=pass
	(cd "$REPO" && PODGATE_KUBELET_VERSION=$kubelet PODGATE_CONTAINERD_VERSION=$containerd \
		go test -race -count=1 -timeout 20m ./test/cluster -run "$CORE_CLUSTER" -v &&
		PODGATE_KUBELET_VERSION=$kubelet PODGATE_CONTAINERD_VERSION=$containerd \
			go test -race -count=1 -timeout 20m ./test/e2e -run "$CORE_E2E" -v) >"$OUT/$name.log" 2>&1 || result=fail
	# A test that skipped did not run: a cell is only a pass when every core test passed.
	passed=$(grep -c '^--- PASS' "$OUT/$name.log" || true)
	skipped=$(grep -c '^--- SKIP' "$OUT/$name.log" || true)
	[ "$skipped" -eq 0 ] || result=fail
	printf '%s %s %s %d %d %d %s\n' "$kubelet" "$containerd" "$result" "$passed" "$skipped" $((SECONDS - start)) "$(date -u +%Y-%m-%d)" >"$OUT/$name.result"
	log "cell kubelet $kubelet × containerd $containerd: $result ($passed passed, $skipped skipped, $((SECONDS - start)) s; log $OUT/$name.log)"
	[ "$result" = pass ] || { failed=1; grep -E '^(--- FAIL|--- SKIP|FAIL|panic)' "$OUT/$name.log" | head -20 >&2 || true; }
done

{
	printf '| kubelet \\ containerd |'; for c in "${CONTAINERDS[@]}"; do printf ' %s |' "$c"; done; echo
	printf '|---|'; for _ in "${CONTAINERDS[@]}"; do printf -- '---|'; done; echo
	for k in "${KUBELETS[@]}"; do
		printf '| %s |' "$k"
		for c in "${CONTAINERDS[@]}"; do
			if [ -s "$OUT/${k}_${c}.result" ]; then
				read -r _ _ r p s d day <"$OUT/${k}_${c}.result"
				printf ' %s (%d tests, %d s, %s) |' "$r" "$p" "$d" "$day"
			else
				printf ' not run |'
			fi
		done
		echo
	done
} | tee "$OUT/tested-with.md"
exit $failed

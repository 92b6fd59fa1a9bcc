#!/usr/bin/env bash
# host-podstart.sh PODGATE [N]: the host's side of the VM lane's pod start figure (BENCHMARKS.md,
# "The VM lane"): on the rig's containerd (test/rig/up.sh, cgroupfs, this host's hierarchy) and
# PODGATE (the binary) in front of it, N times (default 5) what scripts/node.sh does once in the
# guest: crictl runp + create + start of a busybox pod through podgate, then stop and remove.
# Prints each time in ms and the median. Root; the rig (make rig-node rig-tools).
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
PODGATE=$(realpath "$1")
N=${2:-5}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=$(mktemp -d /tmp/pgvh-XXXXXX)
pg_pid=
cleanup() {
	[ -z "$pg_pid" ] || kill "$pg_pid" 2>/dev/null || true
	[ -z "$pg_pid" ] || wait "$pg_pid" 2>/dev/null || true
	bash "$HERE/../rig/down.sh" "$dir/rig" >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT

endpoint=$(bash "$HERE/../rig/up.sh" "$dir/rig" 2>"$dir/up.log" | tail -1)
"$PODGATE" --cri-socket "$dir/podgate.sock" --runtime-endpoint "$endpoint" --state-dir "$dir/state" \
	--metrics-address 0 --podresources-socket "" >"$dir/podgate.log" 2>&1 &
pg_pid=$!
crictl() { "$RIG_DIR/bin/crictl" --runtime-endpoint "unix://$dir/podgate.sock" --image-endpoint "unix://$dir/podgate.sock" --timeout 30s "$@"; }
for _ in $(seq 100); do crictl version >/dev/null 2>&1 && break; sleep 0.1; done

times=()
for i in $(seq "$N"); do
	uid=$(cat /proc/sys/kernel/random/uuid)
	cat >"$dir/pod.json" <<EOF
{"metadata": {"name": "vm-cmp-$i", "namespace": "default", "uid": "$uid", "attempt": 0},
 "log_directory": "$dir/logs-$i",
 "linux": {"cgroup_parent": "/podgate-vm-cmp/pod$uid", "security_context": {"namespace_options": {"network": 0}}}}
EOF
	cat >"$dir/ctr.json" <<'EOF'
{"metadata": {"name": "sleeper"}, "image": {"image": "docker.io/library/busybox:1.35"},
 "command": ["sleep", "3600"], "log_path": "sleeper.log", "linux": {}}
EOF
	s=$(date +%s%N)
	pod=$(crictl runp "$dir/pod.json")
	ctr=$(crictl create "$pod" "$dir/ctr.json" "$dir/pod.json")
	crictl start "$ctr" >/dev/null
	e=$(date +%s%N)
	times+=($(((e - s) / 1000000)))
	crictl stopp "$pod" >/dev/null
	crictl rmp "$pod" >/dev/null
done
printf 'host crictl pod start through podgate (ms): %s\n' "${times[*]}"
printf 'median %s\n' "$(printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')"

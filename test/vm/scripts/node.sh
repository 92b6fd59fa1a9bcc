#!/bin/bash
# node.sh: the VM lane's node tests (test/vm), run as root inside the guest by podgate-vm-run with
# the share (podgate's .deb files, this script) in /mnt/share and OUT for what goes back. Every
# check prints "ok NAME" or "FAIL NAME: why" into $OUT/results.txt and the run's log; figures
# go into $OUT/figures.txt as "NAME VALUE". Exits 1 when a check failed.
#
# The guest: Debian 12, systemd as PID 1, cgroup v2 (unified), containerd with SystemdCgroup =
# true and the rig's runc, CNI bridge, the pause and busybox images, kubelet (not started).
set -u
SHARE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-$SHARE/out}
mkdir -p "$OUT"
: >"$OUT/results.txt"
: >"$OUT/figures.txt"
failed=0
export PATH=/usr/local/bin:$PATH

ok() { echo "ok $*" | tee -a "$OUT/results.txt"; }
fail() {
	echo "FAIL $*" | tee -a "$OUT/results.txt"
	failed=1
}
figure() { echo "$1 $2" | tee -a "$OUT/figures.txt"; }
section() { printf '\n=== %s\n' "$*"; }
# check NAME CMD...: ok when CMD succeeds, else FAIL with its output.
check() {
	local name=$1 outp
	shift
	if outp=$("$@" 2>&1); then
		ok "$name"
	else
		fail "$name: $* -> $outp"
	fi
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
# wait_until SECONDS CMD...: poll CMD every 0.2 s until it succeeds or SECONDS pass.
wait_until() {
	local deadline=$(($(date +%s) + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$deadline" ] || return 1
		sleep 0.2
	done
}
# The unit's restart count and main pid: "restarted 0 pods" is checked against the pods' own
# pids and start times, not the unit's.
unit_prop() { systemctl show -p "$2" --value "$1"; }

section "the node"
echo "pid 1: $(cat /proc/1/comm); cgroup: $(stat -fc %T /sys/fs/cgroup); controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
[ "$(cat /proc/1/comm)" = systemd ] && ok "systemd is PID 1" || fail "systemd is PID 1: $(cat /proc/1/comm)"
[ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && ok "cgroup v2 unified" || fail "cgroup v2 unified: $(stat -fc %T /sys/fs/cgroup)"
check "containerd active" systemctl is-active containerd
# The CRI plugin sees the k8s.io namespace; the tarballs carry their full names.
t=$(now_ms)
for img in /opt/podgate-vm/images/*.tar; do
	ctr -n k8s.io images import "$img" >/dev/null || fail "import $img"
done
figure images_import_ms $(($(now_ms) - t))

section "podgate from its package"
debs=("$SHARE"/podgate_*.deb)
# The newest package is kept for the upgrade; the first one is installed.
first=${debs[0]}
t=$(now_ms)
if DEBIAN_FRONTEND=noninteractive apt-get install -y "$first"; then
	ok "apt install $(basename "$first")"
else
	fail "apt install $(basename "$first")"
fi
figure apt_install_ms $(($(now_ms) - t))
check "podgate enabled" systemctl is-enabled podgate
check "podgate active" systemctl is-active podgate
systemctl show podgate -p Type,ActiveState,SubState,NRestarts,MainPID,ExecMainStartTimestamp,After,Before
[ "$(unit_prop podgate Type)" = notify ] && ok "podgate Type=notify" || fail "podgate Type=notify: $(unit_prop podgate Type)"
# Readiness: with Type=notify, active means podgate sent READY=1; the socket serves by then.
check "CRI socket serves when active" crictl version
journalctl -u podgate --no-pager -o cat | head -5
[ "$(journalctl -u podgate --no-pager -o cat | wc -l)" -gt 0 ] && ok "journal has podgate's lines under its unit" || fail "journal has no lines for podgate.service"

section "a pod through podgate on the systemd cgroup driver"
cat >/tmp/ctr.json <<'EOF'
{"metadata": {"name": "sleeper"}, "image": {"image": "docker.io/library/busybox:1.35"},
 "command": ["sleep", "3600"], "log_path": "sleeper.log", "linux": {}}
EOF
# Three pods one after the other, as host-podstart.sh starts them on the host: runp + create +
# start timed; the first is looked at, each is removed before the next.
for i in 1 2 3; do
	uid=$(cat /proc/sys/kernel/random/uuid)
	slice="kubepods-besteffort-pod${uid//-/_}.slice"
	cat >/tmp/pod.json <<EOF
{"metadata": {"name": "vm-crictl-$i", "namespace": "default", "uid": "$uid", "attempt": 0},
 "log_directory": "/tmp/vm-crictl-logs-$i",
 "linux": {"cgroup_parent": "$slice", "security_context": {"namespace_options": {"network": 0}}}}
EOF
	t=$(now_ms)
	pod=$(crictl runp /tmp/pod.json) && ctr_id=$(crictl create "$pod" /tmp/ctr.json /tmp/pod.json) && crictl start "$ctr_id" >/dev/null
	st=$?
	figure "crictl_pod_start_ms_$i" $(($(now_ms) - t))
	if [ $st != 0 ]; then
		fail "crictl runp + create + start through podgate, pod $i (status $st)"
		break
	fi
	if [ $i = 1 ]; then
		ok "crictl runp + create + start through podgate"
		cpid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$ctr_id")
		cg=$(cat "/proc/$cpid/cgroup")
		echo "container pid $cpid cgroup: $cg"
		case $cg in
		*"/kubepods.slice/kubepods-besteffort.slice/$slice/cri-containerd-$ctr_id.scope") ok "container in its systemd scope under the kubepods slices" ;;
		*) fail "container cgroup: $cg, want .../kubepods.slice/kubepods-besteffort.slice/$slice/cri-containerd-$ctr_id.scope" ;;
		esac
		systemctl status --no-pager "$slice" | head -8
		podgate pods
		podgate pods -o yaml >"$OUT/podgate-pods-crictl.yaml" 2>&1
		grep -i 'cgroup\|slice\|scope' "$OUT/podgate-pods-crictl.yaml"
		if grep -q "$slice" "$OUT/podgate-pods-crictl.yaml"; then ok "podgate pods shows the systemd slice"; else fail "podgate pods does not show $slice"; fi
	fi
	crictl stopp "$pod" >/dev/null && crictl rmp "$pod" >/dev/null || fail "pod $i stop/remove"
	# The container's scope goes with it; the pod's slice stays (systemd keeps the slice the
	# scope was started in: the kubelet removes its pod slices itself, crictl does not).
	if ! wait_until 20 test ! -d "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/$slice/cri-containerd-$ctr_id.scope"; then
		fail "pod $i: its container's scope still there after removal"
	fi
done
grep -q '^FAIL pod' "$OUT/results.txt" || ok "pods stopped and removed, their containers' scopes gone"

# The kubelet's parts, each when the host put it on the share: the standalone kubelet, the API
# server's (with a control plane on the host), then the removal.
for part in kubelet api removal; do
	if [ -x "$SHARE/$part.sh" ]; then
		# shellcheck source=/dev/null
		. "$SHARE/$part.sh"
	fi
done

section "results"
cat "$OUT/results.txt"
echo "$(grep -c '^ok' "$OUT/results.txt") passed, $(grep -c '^FAIL' "$OUT/results.txt") failed"
exit $failed

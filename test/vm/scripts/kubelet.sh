#!/bin/bash
# kubelet.sh: the VM lane's kubelet part (test/vm), sourced by node.sh inside the guest once
# podgate runs from its package (it uses node.sh's ok, fail, figure, check, wait_until, now_ms and
# $debs). The kubelet runs standalone (no API server: static pods from
# /etc/kubernetes/manifests) with cgroupDriver: systemd, through podgate by the package's drop-in:
#
#   - the kubelet starts after podgate (podgate.service is Before=kubelet.service)
#   - a Burstable static pod runs in kubepods-burstable-pod<uid>.slice, its container in
#     cri-containerd-<id>.scope; podgate pods shows the slice
#   - MemoryQoS (on by default in 1.37, cgroup v2): the kubelet writes memory.min/memory.high,
#     podgate writes none (podgate_resources_memory_qos_applied_total 0) and verifies: ok; a
#     memory.high changed behind the kubelet's back is reported at podgate's next recheck
#   - pod-level resources (spec.resources) land on the pod's slice
#   - a newer package: try-restart restarts podgate, 0 containers restarted
#   - systemctl stop podgate while pods run, then start: 0 containers restarted
#
# api.sh and removal.sh go on from here (the static pods, snapshot and same_pods).
#
# "0 containers restarted" is read from the containers themselves: the same IDs, the same
# pids, attempt 0, and no exited container beside them.
set -u

KUBELET_CFG=/var/lib/kubelet/config.yaml
MANIFESTS=/etc/kubernetes/manifests
NODE=podgate-vm

section "the kubelet (cgroupDriver: systemd) through podgate"
mkdir -p "$MANIFESTS"
# podgate verifies the containers' cgroups against the kubelet's values and reads them again
# every 5 s (drift), with memory QoS asked for: the kubelet's configuration tells podgate the
# kubelet writes it itself. An operator's edit of the conffile, kept across the upgrade below.
sed -i -e 's|^\(  memoryQoS:\) false|\1 true|' \
	-e "s|^\(  kubeletConfig:\) \"\"|\1 $KUBELET_CFG|" \
	-e 's|^\(  recheckPeriod:\) 1m|\1 5s|' /etc/podgate/config.yaml
grep -A6 '^resources:' /etc/podgate/config.yaml
check "podgate check-config" podgate check-config /etc/podgate/config.yaml
systemctl restart podgate
check "podgate active after restart with memory QoS" systemctl is-active podgate
journalctl -u podgate --no-pager -o cat | grep -i 'cgroups\|memoryQoS' | tail -3

# A Burstable pod (requests below limits): memory QoS applies to it.
cat >"$MANIFESTS/qos.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: qos, namespace: default}
spec:
  containers:
  - name: sleeper
    image: docker.io/library/busybox:1.35
    imagePullPolicy: Never
    command: [sleep, "3600"]
    resources:
      requests: {cpu: 100m, memory: 64Mi}
      limits: {cpu: 200m, memory: 128Mi}
EOF
t=$(now_ms)
systemctl start kubelet
running() { [ -n "$(crictl ps --name "$1" --state Running -q 2>/dev/null)" ]; }
if wait_until 300 running sleeper; then
	ok "kubelet started, its static pod runs through podgate"
	figure kubelet_start_to_first_pod_ms $(($(now_ms) - t))
else
	fail "static pod qos not running within 300 s"
	journalctl -u kubelet --no-pager -o cat | tail -40
fi
systemctl show kubelet -p After --value | tr ' ' '\n' | grep -q '^podgate.service$' && ok "kubelet ordered after podgate" || fail "kubelet not After=podgate.service: $(systemctl show kubelet -p After)"
journalctl -u kubelet --no-pager -o cat | grep -m1 -i 'runtime.*endpoint\|cri.sock' || true

# The container's cgroup on the systemd driver's paths.
cid=$(crictl ps --name sleeper -q | head -1)
uid=$(crictl inspect -o go-template --template '{{index .status.labels "io.kubernetes.pod.uid"}}' "$cid")
slice="kubepods-burstable-pod${uid//-/_}.slice"
scope=/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/$slice/cri-containerd-$cid.scope
cpid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$cid")
echo "container $cid pid $cpid: $(cat "/proc/$cpid/cgroup")"
[ "$(cat "/proc/$cpid/cgroup")" = "0::${scope#/sys/fs/cgroup}" ] && ok "kubelet's container in $slice/cri-containerd-<id>.scope" || fail "container cgroup $(cat "/proc/$cpid/cgroup"), want 0::${scope#/sys/fs/cgroup}"
for f in memory.min memory.low memory.high memory.max cpu.max cpu.weight; do echo "$f: $(cat "$scope/$f" 2>&1)"; done

podgate pod "default/qos-$NODE" -o yaml >"$OUT/podgate-pod-qos.yaml" 2>&1
podgate pods
if grep -q "$slice" "$OUT/podgate-pod-qos.yaml"; then ok "podgate pod shows the kubelet's systemd slice"; else fail "podgate pod does not show $slice"; fi

section "MemoryQoS: the kubelet writes, podgate verifies"
# The kubelet's values for a Burstable container of request 64Mi, limit 128Mi, with
# TieredReservation and factor 0.9 (guest/var/lib/kubelet/config.yaml): memory.low = the
# request, memory.high = floor((64Mi + 0.9 × 64Mi) / 4096) × 4096; memory.min untouched (0).
want_low=67108864
want_high=127504384
[ "$(cat "$scope/memory.low")" = $want_low ] && ok "kubelet wrote memory.low = request (64Mi)" || fail "memory.low $(cat "$scope/memory.low"), want $want_low"
high=$(cat "$scope/memory.high")
[ "$high" = $want_high ] && ok "kubelet wrote memory.high = $want_high" || fail "memory.high $high, want $want_high"
grep -q "memory.low: \"$want_low\"" "$OUT/podgate-pod-qos.yaml" && ok "podgate saw the kubelet ask memory.low" || fail "podgate's asked values lack memory.low $want_low"
verification() { podgate pod "default/qos-$NODE" -o yaml 2>/dev/null | sed -n 's/^ *verification: //p' | head -1; }
verification_ok() { [ "$(verification)" = ok ]; }
if wait_until 60 verification_ok; then
	ok "podgate's verification of the kubelet's values: ok"
else
	fail "podgate's verification: $(verification)"
fi
metrics() { exec 3<>/dev/tcp/127.0.0.1/9743 && printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && cat <&3 && exec 3<&-; }
applied=$(metrics | awk '$1 == "podgate_resources_memory_qos_applied_total" { print $2 }')
[ "$applied" = 0 ] && ok "podgate wrote no memory QoS (applied_total 0)" || fail "podgate_resources_memory_qos_applied_total = '$applied', want 0"
# Drift: a value changed behind the kubelet's back shows at podgate's next recheck (5 s).
echo max >"$scope/memory.high"
drifted() { podgate pod "default/qos-$NODE" -o yaml 2>/dev/null | grep -q "memory.high: asked"; }
if wait_until 30 drifted; then
	ok "memory.high changed behind the kubelet's back reported: $(verification)"
	podgate pod "default/qos-$NODE" -o yaml | grep -i -A3 'mismatch' | head -8
else
	fail "drift of memory.high not reported within 30 s: $(verification)"
fi
echo "$high" >"$scope/memory.high"
journalctl -u podgate --no-pager -o cat | grep -i 'mismatch\|drift' | tail -3

section "pod-level resources on the pod's slice"
cat >"$MANIFESTS/podlevel.yaml" <<'EOF'
apiVersion: v1
kind: Pod
metadata: {name: podlevel, namespace: default}
spec:
  resources:
    requests: {cpu: 100m, memory: 64Mi}
    limits: {cpu: 300m, memory: 192Mi}
  containers:
  - name: podlevel
    image: docker.io/library/busybox:1.35
    imagePullPolicy: Never
    command: [sleep, "3600"]
EOF
t=$(now_ms)
if wait_until 180 running podlevel; then
	figure kubelet_pod_start_ms $(($(now_ms) - t))
	uid2=$(crictl inspect -o go-template --template '{{index .status.labels "io.kubernetes.pod.uid"}}' "$(crictl ps --name podlevel -q | head -1)")
	pslice=$(find /sys/fs/cgroup/kubepods.slice -maxdepth 2 -name "kubepods-*pod${uid2//-/_}.slice" | head -1)
	echo "pod slice $pslice: memory.max $(cat "$pslice/memory.max" 2>&1) cpu.max $(cat "$pslice/cpu.max" 2>&1)"
	[ "$(cat "$pslice/memory.max" 2>/dev/null)" = 201326592 ] && ok "pod-level memory limit on the pod's slice" || fail "pod slice $pslice memory.max $(cat "$pslice/memory.max" 2>&1), want 201326592"
	podgate pod "default/podlevel-$NODE" -o yaml >"$OUT/podgate-pod-podlevel.yaml" 2>&1
	grep -i 'slice\|podLevel\|pod_level' "$OUT/podgate-pod-podlevel.yaml" | head -5
else
	fail "static pod podlevel not running within 180 s"
fi

# snapshot: each running container as "id pid attempt", sorted; and how many exited.
snapshot() {
	local c
	for c in $(crictl ps -q); do
		crictl inspect -o go-template --template '{{.status.id}} {{.info.pid}} {{.status.metadata.attempt}}' "$c"
	done | grep . | sort
}
exited() { crictl ps -a --state Exited -q | wc -l; }
same_pods() {
	local name=$1 before=$2 after
	after=$(snapshot)
	if [ "$after" = "$before" ] && [ -n "$after" ] && [ "$(exited)" = 0 ]; then
		ok "$name: 0 containers restarted ($(wc -l <<<"$after") running, same IDs and pids)"
	else
		fail "$name: containers before: [$before] after: [$after], exited $(exited)"
	fi
}

section "a newer package: try-restart, 0 pods restarted"
before=$(snapshot)
echo "$before"
pid_before=$(systemctl show -p MainPID --value podgate)
t=$(now_ms)
if DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Options::=--force-confold "${debs[-1]}"; then
	ok "apt install the newer package $(basename "${debs[-1]}")"
else
	fail "apt install $(basename "${debs[-1]}")"
fi
figure apt_upgrade_ms $(($(now_ms) - t))
pid_after=$(systemctl show -p MainPID --value podgate)
echo "podgate pid $pid_before -> $pid_after; $(dpkg-query -W podgate)"
[ "$pid_after" != "$pid_before" ] && [ "$pid_after" != 0 ] && ok "podgate restarted by the upgrade (try-restart)" || fail "podgate pid $pid_before -> $pid_after: not restarted"
check "podgate active after the upgrade" systemctl is-active podgate
grep -q '^  memoryQoS: true' /etc/podgate/config.yaml && ok "the operator's config kept across the upgrade" || fail "config.yaml lost its edit"
# The kubelet's next relists and pod syncs (every 1 s and 10 s) would restart what they saw
# fail: 20 s covers two syncs.
sleep 20
same_pods "upgrade" "$before"

section "systemctl stop podgate while pods run, then start"
before=$(snapshot)
systemctl stop podgate
check "podgate inactive after stop" sh -c '! systemctl is-active podgate'
# The containers run on without podgate (containerd runs them); the kubelet finds no runtime
# for 20 s, two of its pod syncs.
sleep 20
alive=0
while read -r _ p _; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done <<<"$before"
[ "$alive" = "$(wc -l <<<"$before")" ] && ok "containers run while podgate is stopped ($alive)" || fail "only $alive of $(wc -l <<<"$before") containers alive while podgate stopped"
t=$(now_ms)
systemctl start podgate
figure podgate_start_ms $(($(now_ms) - t))
check "podgate active after start" systemctl is-active podgate
sleep 20
same_pods "stop/start" "$before"


#!/bin/bash
# api.sh: the VM lane's API server part (test/vm), sourced by node.sh inside the guest after
# kubelet.sh when the host runs a control plane (vm-test.sh through test/vm/controlplane): its
# kubeconfig and port are on the share, kube-apiserver is reached through qemu's guestfwd
# (10.0.2.100:6443, restrict=on: nothing else leaves the guest) and a socat on the guest's
# loopback at the host's port, so that the kubeconfig's https://127.0.0.1:PORT and its
# certificate hold as they are.
#
#   - the kubelet (restarted with the kubeconfig) registers the node; podgate gets the kubeconfig
#   - the kubelet's MemoryQoS off (featureGates in its config file, which podgate reads):
#     podgate writes memory QoS itself (podgate_resources_memory_qos_applied_total > 0,
#     memory.high in the container's scope) and verifies it: ok
#   - an in-place resize of that container (the pod's resize subresource): UpdateContainerResources
#     through podgate, memory.max and podgate's memory.high on the scope, verification ok
#   - an in-place pod-level resize: UpdatePodSandboxResources, the pod's slice verified ok
set -u

[ -s "$SHARE/kubeconfig" ] && [ -s "$SHARE/apiserver-port" ] || return 0
NODE=podgate-vm
PORT=$(cat "$SHARE/apiserver-port")
KUBECONFIG_FILE=/etc/kubernetes/kubelet.kubeconfig

section "the API server through qemu's forwarding"
# The virtio NIC qemu gave (user-mode network, restrict=on), by its driver: cni0 and the
# pods' veths are there too.
nic=
for d in /sys/class/net/*; do
	[ "$(basename "$(readlink -f "$d/device/driver" 2>/dev/null)")" = virtio_net ] && nic=$(basename "$d")
done
if [ -z "$nic" ]; then
	fail "no virtio network interface for the API server"
	return 0
fi
ip addr add 10.0.2.15/24 dev "$nic" && ip link set "$nic" up
systemd-run --unit=apiserver-tunnel socat "TCP-LISTEN:$PORT,bind=127.0.0.1,fork,reuseaddr" TCP:10.0.2.100:6443
install -m 0600 "$SHARE/kubeconfig" "$KUBECONFIG_FILE"
token=$(awk '$1 == "token:" { print $2 }' "$KUBECONFIG_FILE")
awk '$1 == "certificate-authority-data:" { print $2 }' "$KUBECONFIG_FILE" | base64 -d >/etc/kubernetes/apiserver-ca.crt
server=https://127.0.0.1:$PORT
api() {
	local path=$1
	shift
	curl -sS --fail-with-body --cacert /etc/kubernetes/apiserver-ca.crt -H "Authorization: Bearer $token" "$@" "$server$path"
}
if wait_until 60 api /readyz; then ok "kube-apiserver reached from the guest"; else
	fail "kube-apiserver not reached at $server"
	return 0
fi

# MemoryQoS off in the kubelet's own file, which podgate reads (resources.kubeletConfig): the
# reservation policy goes (TieredReservation needs the gate), the factor stays.
sed -i -e '/^memoryReservationPolicy:/d' "$KUBELET_CFG"
printf 'featureGates:\n  MemoryQoS: false\n' >>"$KUBELET_CFG"
mkdir -p /etc/systemd/system/kubelet.service.d
cat >/etc/systemd/system/kubelet.service.d/20-api.conf <<EOF
[Service]
ExecStart=
ExecStart=/usr/local/bin/kubelet --config=$KUBELET_CFG --config-dir=/etc/kubernetes/kubelet.conf.d --kubeconfig=$KUBECONFIG_FILE --hostname-override=$NODE --v=2
EOF
sed -i -e "s|^kubeconfig: \"\"|kubeconfig: $KUBECONFIG_FILE|" -e "s|^nodeName: \"\"|nodeName: $NODE|" /etc/podgate/config.yaml
grep -E '^(kubeconfig|nodeName):' /etc/podgate/config.yaml
check "podgate check-config with the kubeconfig" podgate check-config /etc/podgate/config.yaml
systemctl daemon-reload
systemctl restart podgate
check "podgate active with the kubeconfig" systemctl is-active podgate
journalctl -u podgate --no-pager -o cat | grep -E 'Kubernetes API access|Memory QoS|"Cgroups"' | tail -3
static_before=$(snapshot)
t=$(now_ms)
systemctl restart kubelet
node_ready() { api "/api/v1/nodes/$NODE" | jq -e '.status.conditions[] | select(.type == "Ready") | .status == "True"' >/dev/null; }
if wait_until 300 node_ready; then
	ok "kubelet registered node $NODE, Ready"
	figure kubelet_restart_to_node_ready_ms $(($(now_ms) - t))
else
	fail "node $NODE not Ready within 300 s"
	journalctl -u kubelet --no-pager -o cat | tail -30
fi
same_pods "kubelet switched to the API server, podgate to its kubeconfig" "$static_before"

# pod NAME RESOURCES [POD_RESOURCES]: an API pod on this node, busybox sleeping (and leaving at
# once on SIGTERM), with the container's resources and the pod's, as JSON.
pod() {
	jq -n --arg name "$1" --arg node "$NODE" --argjson res "$2" --argjson podres "${3:-null}" '{
		apiVersion: "v1", kind: "Pod", metadata: {name: $name, namespace: "default"},
		spec: ({nodeName: $node, automountServiceAccountToken: false, terminationGracePeriodSeconds: 5,
			containers: [{name: "c", image: "docker.io/library/busybox:1.35", imagePullPolicy: "Never",
				command: ["sh", "-c", "trap \"exit 0\" TERM; sleep 3600 & wait"], resources: $res}]}
			+ (if $podres == null then {} else {resources: $podres} end))}'
}
pod_running() { api "/api/v1/namespaces/default/pods/$1" | jq -e '.status.phase == "Running"' >/dev/null; }
# scope_of POD: the cgroup directory of the pod's container.
scope_of() {
	local cid cpid
	cid=$(crictl ps --label "io.kubernetes.pod.name=$1" -q | head -1)
	cpid=$(crictl inspect -o go-template --template '{{.info.pid}}' "$cid")
	echo "/sys/fs/cgroup$(cut -d: -f3 "/proc/$cpid/cgroup")"
}
container_verification() { podgate pod "default/$1" -o json | jq -r '.containers[0].verification'; }
# container_ok POD: podgate's verification of the pod's container says ok (a predicate for
# wait_until, which runs it again each time).
container_ok() { [ "$(container_verification "$1")" = ok ]; }
metric() {
	exec 3<>/dev/tcp/127.0.0.1/9743 && printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && cat <&3 && exec 3<&-
}
metric_value() { metric | awk -v n="$1" '$1 == n { print $2 }'; }

section "MemoryQoS off in the kubelet: podgate's own memory QoS"
applied0=$(metric_value podgate_resources_memory_qos_applied_total)
t=$(now_ms)
pod qos-api '{"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "200m", "memory": "128Mi"}}' |
	api /api/v1/namespaces/default/pods -X POST -H 'Content-Type: application/json' -d @- >/dev/null
if wait_until 180 pod_running qos-api; then
	figure api_pod_start_ms $(($(now_ms) - t))
	scope=$(scope_of qos-api)
	echo "qos-api: $scope"
	for f in memory.min memory.low memory.high memory.max; do echo "$f: $(cat "$scope/$f")"; done
	applied=$(metric_value podgate_resources_memory_qos_applied_total)
	[ "${applied%.*}" -gt "${applied0%.*}" ] && ok "podgate wrote memory QoS (applied_total $applied0 -> $applied)" || fail "podgate_resources_memory_qos_applied_total $applied0 -> $applied: podgate wrote no memory QoS"
	# podgate's values, the kubelet 1.36's formula: policy None (memory.low 0), factor 0.9.
	[ "$(cat "$scope/memory.high")" = 127504384 ] && ok "memory.high 127504384 written by podgate" || fail "memory.high $(cat "$scope/memory.high"), want 127504384"
	case $scope in
	*/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod*.slice/cri-containerd-*.scope) ok "API pod's container on the systemd driver's scope" ;;
	*) fail "API pod's container cgroup $scope" ;;
	esac
	if wait_until 60 container_ok qos-api; then ok "podgate's verification of its own memory QoS: ok"; else fail "verification $(container_verification qos-api)"; fi
	podgate pod default/qos-api -o yaml >"$OUT/podgate-pod-qos-api.yaml" 2>&1

	section "in-place resize of the container"
	before_v=$(podgate pod default/qos-api -o json | jq -r '.containers[0].verifiedAt // .containers[0].verified_at')
	api /api/v1/namespaces/default/pods/qos-api/resize -X PATCH -H 'Content-Type: application/strategic-merge-patch+json' \
		-d '{"spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"150m","memory":"64Mi"},"limits":{"cpu":"300m","memory":"160Mi"}}}]}}' >/dev/null &&
		ok "resize accepted by the API server" || fail "resize refused"
	resized() { [ "$(cat "$scope/memory.max")" = 167772160 ]; }
	if wait_until 120 resized; then ok "container resized in place: memory.max 160Mi"; else fail "memory.max $(cat "$scope/memory.max") after the resize, want 167772160"; fi
	# Verified again since the resize, and ok: one reading of both, so that a verification still
	# pending when the bound runs out (the guest runs 8x slower than the host, and slower still on
	# a loaded host) is reported as what it was, not read again once it is done.
	reverified_ok() {
		local j
		j=$(podgate pod default/qos-api -o json) || return 1
		last_v=$(jq -r '.containers[0].verification' <<<"$j")
		[ "$(jq -r '.containers[0].verifiedAt // .containers[0].verified_at' <<<"$j")" != "$before_v" ] && [ "$last_v" = ok ]
	}
	last_v=unknown
	reverified=false
	wait_until 180 reverified_ok && reverified=true
	# floor((64Mi + 0.9 × (160Mi − 64Mi)) / 4096) × 4096
	[ "$(cat "$scope/memory.high")" = 157704192 ] && ok "memory.high follows the resize (157704192, podgate's)" || fail "memory.high $(cat "$scope/memory.high") after the resize, want 157704192"
	$reverified && ok "podgate's verification after the resize: ok" || fail "verification after the resize, within 180 s: $last_v"
	metric | grep -E '^podgate_resources_verifications_total' || true
else
	fail "API pod qos-api not running within 180 s"
fi

section "in-place pod-level resize on the pod's slice"
pod podlevel-api '{}' '{"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}}' |
	api /api/v1/namespaces/default/pods -X POST -H 'Content-Type: application/json' -d @- >/dev/null
if wait_until 180 pod_running podlevel-api; then
	pslice=$(dirname "$(scope_of podlevel-api)")
	echo "podlevel-api slice $pslice: memory.max $(cat "$pslice/memory.max") cpu.max $(cat "$pslice/cpu.max")"
	api /api/v1/namespaces/default/pods/podlevel-api/resize -X PATCH -H 'Content-Type: application/strategic-merge-patch+json' \
		-d '{"spec":{"resources":{"requests":{"cpu":"300m","memory":"64Mi"},"limits":{"cpu":"800m","memory":"192Mi"}}}}' >/dev/null &&
		ok "pod-level resize accepted" || fail "pod-level resize refused"
	pod_verification() { podgate pod default/podlevel-api -o json | jq -r '.podResources.verification // .pod_resources.verification'; }
	pod_resized() { [ "$(cat "$pslice/memory.max")" = 201326592 ] && v=$(pod_verification) && [ "$v" != unverified ] && [ "$v" != null ]; }
	if wait_until 120 pod_resized; then
		ok "pod slice resized in place: memory.max 192Mi"
		# podgate reads the slice once the CRI calls pause after UpdatePodSandboxResources; the
		# kubelet may write the slice's CPU later than that (seen here under emulation: the old
		# cpu.weight read), and podgate's rechecks (every 5 s here) read it again.
		pod_ok() { [ "$(pod_verification)" = ok ]; }
		if wait_until 60 pod_ok; then
			ok "podgate's pod-level verification on the slice: ok"
		else
			fail "pod-level verification $(pod_verification): $(podgate pod default/podlevel-api -o yaml | grep -A3 '^  mismatches:' | tr -s ' \n' ' ')"
		fi
	else
		fail "pod-level resize: slice memory.max $(cat "$pslice/memory.max"), podgate $(pod_verification)"
	fi
	podgate pod default/podlevel-api -o yaml >"$OUT/podgate-pod-podlevel-api.yaml" 2>&1
	grep -A12 'pod_resources:' "$OUT/podgate-pod-podlevel-api.yaml"
else
	fail "API pod podlevel-api not running within 180 s"
fi
# The API pods go; the static pods stay for the removal that follows.
api /api/v1/namespaces/default/pods/qos-api -X DELETE >/dev/null
api /api/v1/namespaces/default/pods/podlevel-api -X DELETE >/dev/null
gone() { ! crictl ps --label io.kubernetes.pod.name="$1" -q | grep -q .; }
wait_until 120 gone qos-api && wait_until 120 gone podlevel-api && ok "API pods deleted" || fail "API pods still running after delete"

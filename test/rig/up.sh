#!/usr/bin/env bash
# up.sh DIR: start a private containerd whose root, state, sockets, config, CNI network and logs
# all live in DIR, import the rig's pause and busybox images, and print its endpoint
# (unix://DIR/containerd.sock) as the last line on stdout. Stop it with down.sh DIR.
#
# Several rigs may run at once (go test runs packages in parallel): nothing here uses a path or
# name outside DIR except the CNI bridge, which each rig claims for itself (see claim_bridge).
#
# The binaries and images come from install.sh, in $PODGATE_RIG_DIR (default /var/lib/podgate-rig).
# Exit status: 0 up; 3 refused before changing anything; other: failed part-way, run down.sh DIR.
#
# This script is also run from memory by the Go package (bash -c), so it must not rely on its own
# location.
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
LOG_LEVEL=${PODGATE_RIG_LOG_LEVEL:-info}
READY_TIMEOUT=${PODGATE_RIG_READY_TIMEOUT:-30} # seconds for containerd to answer
# A test may chain its own CNI plugins after the bridge: JSON objects, comma-separated, and the
# directory holding their binaries.
CNI_CHAIN=${PODGATE_RIG_CNI_CHAIN:-}
CNI_BIN_DIR=${PODGATE_RIG_CNI_BIN_DIR:-}
# A test may have containerd trace to its OTLP/gRPC collector (host:port). containerd 2.x takes
# its tracing from the OpenTelemetry environment, not from config.toml.
OTLP_ENDPOINT=${PODGATE_RIG_OTLP_ENDPOINT:-}
# PODGATE_RIG_METRICS_ADDRESS: host:port where containerd serves its Prometheus metrics (its gRPC
# calls with their latency histograms, grpc_histogram); empty: none.
METRICS_ADDRESS=${PODGATE_RIG_METRICS_ADDRESS:-}
# PODGATE_RIG_CNI_CONFIG: a CNI network configuration (conflist) containerd uses instead of the
# bridge network, e.g. multus delegating to it (network "pgrig" of this conf dir). Empty: none.
CNI_CONFIG=${PODGATE_RIG_CNI_CONFIG:-}
# PODGATE_RIG_NRI_SOCKET: turns containerd's NRI on, serving at this path. Empty: NRI off.
NRI_SOCKET=${PODGATE_RIG_NRI_SOCKET:-}
# The containerd of a matrix cell (make matrix, make test's skew lane): a release install.sh put
# in $RIG_DIR/containerd/VERSION. Unset: the default, in $RIG_DIR/bin.
CONTAINERD_BIN=$RIG_DIR/bin
[ -z "${PODGATE_CONTAINERD_VERSION:-}" ] || CONTAINERD_BIN=$RIG_DIR/containerd/$PODGATE_CONTAINERD_VERSION
PAUSE_IMAGE=registry.k8s.io/pause:3.10
BUSYBOX_IMAGE=docker.io/library/busybox:1.35

log() { printf 'rig up: %s\n' "$*" >&2; }
# refuse: a precondition failed and nothing was changed; exit status 3 tells the caller that
# there is nothing to clean up (above all: not a rig that already runs in DIR).
refuse() {
	log "$*"
	exit 3
}
die() {
	log "$*"
	exit 1
}

[ $# -eq 1 ] || refuse "usage: up.sh DIR (a short path such as /tmp/pgr-XXXXXX)"
[ "$(id -u)" = 0 ] || refuse "needs root (containerd, mounts, network namespaces)"

for f in "$CONTAINERD_BIN/containerd" "$CONTAINERD_BIN/containerd-shim-runc-v2" "$CONTAINERD_BIN/ctr" "$RIG_DIR/bin/runc" "$RIG_DIR/images/pause.tar" "$RIG_DIR/images/busybox.tar"; do
	[ -e "$f" ] || refuse "rig not installed: $f is missing; run test/rig/install.sh (make rig; make matrix for another containerd)"
done
for p in bridge host-local loopback; do
	[ -x "/usr/lib/cni/$p" ] || refuse "CNI plugin /usr/lib/cni/$p missing; run test/rig/install.sh (make rig)"
done

# The canonical path: down.sh and the pid/mount/process matching all compare against it.
DIR=$(realpath -m -- "$1")
SOCK=$DIR/containerd.sock
# sun_path holds 108 bytes including the NUL; containerd also listens on SOCK.ttrpc.
[ $((${#SOCK} + 6)) -lt 108 ] || refuse "DIR too long for a unix socket path: $DIR (use e.g. /tmp/pgr-XXXXXX)"
mkdir -p "$DIR"

# containerd_pid prints the pid of this DIR's running containerd, if any. The pid file alone is
# not trusted (pids are reused): the process must be a containerd started with this DIR's config.
containerd_pid() {
	local pid
	pid=$(cat "$DIR/containerd.pid" 2>/dev/null) || return 1
	[ -n "$pid" ] && tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qxF -- "$DIR/config.toml" &&
		echo "$pid"
}
if pid=$(containerd_pid); then
	refuse "a rig containerd (pid $pid) already runs in $DIR; stop it with down.sh $DIR"
fi
if [ -n "$(ls -A "$DIR")" ] && [ ! -e "$DIR/.podgate-rig" ]; then
	refuse "$DIR is not empty and not a rig directory; refusing to use it"
fi
# The marker tells down.sh that DIR is ours to delete.
touch "$DIR/.podgate-rig"
mkdir -p "$DIR/root" "$DIR/state" "$DIR/runc" "$DIR/opt" "$DIR/cni/net.d" "$DIR/cni/ipam"

# claim_bridge picks this rig's bridge and subnet. Two rigs on one bridge and subnet with separate
# host-local IPAM stores would hand out the same addresses, so each rig claims slot N: bridge
# pgrigN, subnet 10.77.N.0/24. Creating the link is the claim: `ip link add` is atomic and fails
# when another rig holds the name. The alias records the owner, so down.sh deletes only its own.
claim_bridge() {
	local n
	if [ -s "$DIR/rig.env" ]; then
		# A restart in the same DIR keeps its slot, if the bridge is still ours.
		n=$(sed -n 's/^SLOT=//p' "$DIR/rig.env")
		if [ -n "$n" ] && [ "$(cat "/sys/class/net/pgrig$n/ifalias" 2>/dev/null)" = "$DIR" ]; then
			echo "$n"
			return
		fi
	fi
	for n in $(seq 0 254); do
		if ip link add name "pgrig$n" type bridge 2>/dev/null; then
			# set -e does not apply inside $(...) || die: check by hand.
			if ! ip link set dev "pgrig$n" alias "$DIR"; then
				ip link delete "pgrig$n"
				return 1
			fi
			echo "$n"
			return
		fi
	done
	return 1
}
SLOT=$(claim_bridge) || die "no free rig bridge (pgrig0..pgrig254 all exist); stale rigs? see ip link show type bridge"
BRIDGE=pgrig$SLOT
SUBNET=10.77.$SLOT.0/24
cat >"$DIR/rig.env" <<EOF
SLOT=$SLOT
BRIDGE=$BRIDGE
SUBNET=$SUBNET
ENDPOINT=unix://$SOCK
EOF

# The pod network: a bridge with host-local IPAM whose store lives in DIR. isGateway gives the
# bridge the .1 address so the host reaches its pods; there is no default route and no masquerade,
# because tests may only talk to pods they created, never beyond. containerd adds the loopback
# interface itself (loopback plugin from bin_dirs), so the list holds only the bridge.
cat >"$DIR/cni/net.d/10-pgrig.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "pgrig",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$SUBNET"}]],
        "dataDir": "$DIR/cni/ipam"
      }
    }${CNI_CHAIN:+,
    $CNI_CHAIN}
  ]
}
EOF
# containerd takes the first configuration in file name order (max_conf_num = 1).
if [ -n "$CNI_CONFIG" ]; then
	printf '%s\n' "$CNI_CONFIG" >"$DIR/cni/net.d/00-primary.conflist"
else
	rm -f "$DIR/cni/net.d/00-primary.conflist"
fi

# containerd's configuration. Everything that defaults to a host-wide path is moved into DIR, so
# that rigs do not see each other and down.sh knows what to clean:
# - netns_mounts_under_state_dir: pod network namespaces under
#   DIR/state/io.containerd.grpc.v1.cri/netns, not /var/run/netns (so `ip netns` never lists them);
# - runc Root: runc's container state under DIR/runc, not /run/containerd/runc;
# - the opt plugin's directory (default /opt/containerd);
# - NRI disabled: every instance would otherwise serve /var/run/nri/nri.sock; a rig that needs it
#   (PODGATE_RIG_NRI_SOCKET) serves it at the caller's path, with its plugin directories in DIR.
# Left host-wide: the shims' sockets under /run/containerd/s, named by a hash of this socket's
# path (down.sh removes the ones of this DIR), and the bridge claimed above.
# restrict_oom_score_adj: these hosts lack CAP_SYS_RESOURCE, and without it every sandbox fails
# with "failed to update /proc/self/oom_score_adj: Permission denied".
# SystemdCgroup = false: no systemd here, and the host is cgroup v1/v2 hybrid: cgroupfs it is.
# Version 3: containerd 2.4's own format is version 4 (the grpc/ttrpc/debug sections become
# plugins 'io.containerd.server.v1.*'); 2.4 migrates version 3 on load and logs a warning,
# while containerd 2.0-2.3 would not read version 4.
cat >"$DIR/config.toml" <<EOF
version = 3
root = '$DIR/root'
state = '$DIR/state'

[grpc]
  address = '$SOCK'

[debug]
  level = '$LOG_LEVEL'

[plugins]
EOF
if [ -n "$NRI_SOCKET" ]; then
	mkdir -p "$DIR/nri/plugins" "$DIR/nri/conf.d"
	cat >>"$DIR/config.toml" <<EOF
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '$NRI_SOCKET'
    plugin_path = '$DIR/nri/plugins'
    plugin_config_path = '$DIR/nri/conf.d'
EOF
else
	cat >>"$DIR/config.toml" <<EOF
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
EOF
fi
cat >>"$DIR/config.toml" <<EOF

  [plugins.'io.containerd.internal.v1.opt']
    path = '$DIR/opt'

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$PAUSE_IMAGE'

  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = '$RIG_DIR/bin/runc'
          Root = '$DIR/runc'
          SystemdCgroup = false

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ['/usr/lib/cni'${CNI_BIN_DIR:+, '$CNI_BIN_DIR'}]
      conf_dir = '$DIR/cni/net.d'
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    # Port 0: each rig's streaming server (exec, attach, port-forward) gets its own port.
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
EOF
if [ -n "$METRICS_ADDRESS" ]; then
	cat >>"$DIR/config.toml" <<EOF

[metrics]
  address = '$METRICS_ADDRESS'
  grpc_histogram = true
EOF
fi

# The host is cgroup v1/v2 hybrid on purpose; ctr would repeat containerd's cgroup v1
# deprecation warning on every call.
ctr() { CONTAINERD_SUPPRESS_DEPRECATION_WARNINGS=1 "$CONTAINERD_BIN/ctr" --address "$SOCK" "$@"; }

fail() {
	log "$*"
	if [ -s "$DIR/containerd.log" ]; then
		log "last lines of $DIR/containerd.log:"
		tail -n 30 "$DIR/containerd.log" >&2
	fi
	log "clean up with: down.sh $DIR"
	exit 1
}

# containerd finds containerd-shim-runc-v2 on PATH. setsid puts it in its own session, so a ^C on
# the terminal that ran the tests does not kill it half-way; down.sh is what stops it. Its output
# goes to the log only: an inherited stdout would keep the caller's pipe open forever.
log "starting containerd $("$CONTAINERD_BIN/containerd" --version | awk '{print $3}') in $DIR (bridge $BRIDGE, subnet $SUBNET)"
tracing_env=()
if [ -n "$OTLP_ENDPOINT" ]; then
	tracing_env=(OTEL_EXPORTER_OTLP_ENDPOINT="http://$OTLP_ENDPOINT" OTEL_EXPORTER_OTLP_PROTOCOL=grpc OTEL_SERVICE_NAME=containerd)
fi
PATH="$CONTAINERD_BIN:$RIG_DIR/bin:$PATH" env "${tracing_env[@]}" setsid "$CONTAINERD_BIN/containerd" --config "$DIR/config.toml" \
	</dev/null >>"$DIR/containerd.log" 2>&1 &
echo $! >"$DIR/containerd.pid"

deadline=$((SECONDS + READY_TIMEOUT))
until ctr --timeout 2s version >/dev/null 2>&1; do
	kill -0 "$(cat "$DIR/containerd.pid")" 2>/dev/null || fail "containerd exited during start-up"
	[ "$SECONDS" -lt "$deadline" ] || fail "containerd did not answer on $SOCK within ${READY_TIMEOUT}s"
	sleep 0.2
done

# The CRI plugin only sees images in the k8s.io namespace. The tarballs carry their full names in
# RepoTags, so they come out as the names the tests and the pinned sandbox image use; checked below
# because a short name would be stored as-is ("busybox:1.35") and CRI would not find it.
for img in pause busybox; do
	ctr -n k8s.io images import "$RIG_DIR/images/$img.tar" >/dev/null ||
		fail "import $RIG_DIR/images/$img.tar failed"
done
have=$(ctr -n k8s.io images ls -q)
for want in "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"; do
	grep -qxF "$want" <<<"$have" || fail "image $want missing after import; have: $(tr "\n" " " <<<"$have")"
done

log "containerd $(cat "$DIR/containerd.pid") ready"
echo "unix://$SOCK"

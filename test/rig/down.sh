#!/usr/bin/env bash
# down.sh DIR: stop everything up.sh DIR started and remove DIR. Idempotent: a DIR that is gone,
# half started or already stopped is fine. It only ever touches what belongs to DIR:
#   - the containerd started with DIR/config.toml,
#   - the runc containers whose state is in DIR/runc,
#   - the shims that serve DIR/containerd.sock, and their sockets under /run/containerd/s,
#   - mounts under DIR (rootfs overlays, pod /dev/shm, pod network namespaces),
#   - the bridge whose alias is DIR.
# Graceful removal of pods (CNI DEL and all) is the job of the caller, through CRI, before this
# runs; this is the hammer that leaves nothing behind whatever state containerd is in.
#
# This script is also run from memory by the Go package (bash -c), so it must not rely on its own
# location.
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
STOP_TIMEOUT=${PODGATE_RIG_STOP_TIMEOUT:-10} # seconds containerd gets to exit on SIGTERM

log() { printf 'rig down: %s\n' "$*" >&2; }
die() {
	log "$*"
	exit 1
}

[ $# -eq 1 ] || die "usage: down.sh DIR"
[ "$(id -u)" = 0 ] || die "needs root"
if [ ! -d "$1" ]; then
	exit 0 # already down
fi
DIR=$(cd "$1" && pwd -P)
# A wrong argument must not make this script kill or delete anything: DIR must be marked by
# up.sh. An empty directory (up.sh failed before marking it) is simply removed.
if [ ! -e "$DIR/.podgate-rig" ]; then
	if [ -z "$(ls -A "$DIR")" ]; then
		rmdir "$DIR"
		exit 0
	fi
	die "$DIR is not a rig directory (no .podgate-rig marker); refusing to touch it"
fi
SOCK=$DIR/containerd.sock

# args_of PID: the process's arguments, one per line (nothing when it is gone).
args_of() { tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" || true; }

# arg_after NAME: from args_of output on stdin, the argument that follows NAME.
arg_after() { awk -v n="$1" 'prev == n { print; exit } { prev = $0 }'; }

# pids_with_args ARG1 ARG2: pids of processes that have ARG1 immediately followed by ARG2 among
# their arguments. Whole arguments, not substrings: /tmp/pgr-a must not match /tmp/pgr-ab, nor
# this script's own command line, which contains the text of the patterns.
pids_with_args() {
	local p prev arg args
	for p in /proc/[0-9]*; do
		mapfile -d '' -t args 2>/dev/null <"$p/cmdline" || continue
		prev=
		for arg in "${args[@]}"; do
			if [ "$prev" = "$1" ] && [ "$arg" = "$2" ]; then
				echo "${p#/proc/}"
				break
			fi
			prev=$arg
		done
	done
}

# wait_gone SECONDS PID...: wait until the pids have exited; false on timeout.
wait_gone() {
	local deadline=$((SECONDS + $1)) p alive
	shift
	while :; do
		alive=
		for p in "$@"; do
			if kill -0 "$p" 2>/dev/null; then alive=1; fi
		done
		[ -z "$alive" ] && return 0
		[ "$SECONDS" -lt "$deadline" ] || return 1
		sleep 0.1
	done
}

# 1. containerd. Found by its command line rather than trusted from the pid file, which may
#    name a reused pid. It gets SIGTERM first so it can close its database cleanly.
mapfile -t ctrd < <(pids_with_args --config "$DIR/config.toml")
if [ ${#ctrd[@]} -gt 0 ]; then
	kill -TERM "${ctrd[@]}" 2>/dev/null || true
	if ! wait_gone "$STOP_TIMEOUT" "${ctrd[@]}"; then
		log "containerd ${ctrd[*]} ignored SIGTERM for ${STOP_TIMEOUT}s; killing it"
		kill -KILL "${ctrd[@]}" 2>/dev/null || true
		wait_gone 5 "${ctrd[@]}" || die "containerd ${ctrd[*]} does not die"
	fi
fi

# 2. Containers. Shims outlive containerd, and their containers outlive the shims, so each runc
#    container recorded in this rig's runc root is force-deleted: that kills its processes and
#    removes its cgroups.
if [ -x "$RIG_DIR/bin/runc" ]; then
	for root in "$DIR"/runc/*/; do
		[ -d "$root" ] || continue
		for id in $("$RIG_DIR/bin/runc" --root "$root" list -q 2>/dev/null); do
			"$RIG_DIR/bin/runc" --root "$root" delete --force "$id" >/dev/null 2>&1 ||
				log "runc delete --force $id failed (root $root)"
		done
	done
fi

# 3. Shims serving this rig's socket ("-address DIR/containerd.sock"). Their socket lives outside
#    DIR, in /run/containerd/s, named by sha256(address/namespace/id) (containerd's
#    shim.SocketAddress); compute it from the shim's own arguments and remove it too.
mapfile -t shims < <(pids_with_args -address "$SOCK")
sockets=()
for p in "${shims[@]}"; do
	ns=$(args_of "$p" | arg_after -namespace)
	id=$(args_of "$p" | arg_after -id)
	if [ -n "$ns" ] && [ -n "$id" ]; then
		h=$(printf '%s' "$SOCK/$ns/$id" | sha256sum | cut -d' ' -f1)
		hd=$(printf '%s' "$SOCK/$ns/$id/debug" | sha256sum | cut -d' ' -f1)
		sockets+=("/run/containerd/s/$h" "/run/containerd/s/$hd")
	fi
done
if [ ${#shims[@]} -gt 0 ]; then
	kill -KILL "${shims[@]}" 2>/dev/null || true
	wait_gone 5 "${shims[@]}" || log "shims ${shims[*]} still alive"
fi
if [ ${#sockets[@]} -gt 0 ]; then
	rm -f "${sockets[@]}"
fi

# 4. Mounts under DIR, deepest first: mountinfo lists a mount after the one it sits on, so the
#    reverse order unmounts children before parents. Pod network namespaces are nsfs bind mounts
#    under DIR/state/io.containerd.grpc.v1.cri/netns (up.sh keeps them out of /var/run/netns);
#    with the last mount and process gone the kernel frees the namespace, and the pod's veth
#    with it. A lazy unmount is the fallback for a busy mount.
for round in 1 2 3; do
	mapfile -t mounts < <(awk -v d="$DIR/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | tac)
	[ ${#mounts[@]} -eq 0 ] && break
	for m in "${mounts[@]}"; do
		m=$(printf '%b' "$m") # mountinfo escapes spaces and the like as \040
		if [ "$round" -lt 3 ]; then
			umount "$m" 2>/dev/null || true
		else
			umount -l "$m" 2>/dev/null || log "cannot unmount $m"
		fi
	done
done

# 5. The bridge this rig claimed, if it still carries our alias.
if [ -s "$DIR/rig.env" ]; then
	bridge=$(sed -n 's/^BRIDGE=//p' "$DIR/rig.env")
	if [ -n "$bridge" ] && [ "$(cat "/sys/class/net/$bridge/ifalias" 2>/dev/null)" = "$DIR" ]; then
		ip link delete "$bridge" type bridge 2>/dev/null || log "cannot delete bridge $bridge"
	fi
fi

# 6. DIR itself. --one-file-system: if a mount survived, do not delete through it into whatever
#    it shows.
rm -rf --one-file-system "$DIR" || die "cannot remove $DIR"

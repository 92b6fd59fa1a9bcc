#!/usr/bin/env bash
# run.sh SCRIPT OUT [FILE...]: boot the VM lane's node image (test/vm/install.sh) once, run SCRIPT
# inside it as root once systemd has reached multi-user.target, and power it off. FILEs are put
# beside SCRIPT on the guest's /mnt/share (podgate's .deb, say). OUT receives, from the guest,
# boot.txt (systemd-analyze), run.log (SCRIPT's output), what SCRIPT wrote into $OUT, journal.txt
# and status (SCRIPT's exit status); from the host, console.log (the serial console) and
# times.txt. Exits with SCRIPT's status, or 124 when the VM did not finish within VM_TIMEOUT.
#
# The VM has no network interface (-nic none) unless VM_APISERVER_PORT says: nothing inside
# reaches out, nothing outside reaches in; the share is a 9p folder (qemu -virtfs) of the host's.
#
# Settings (environment):
#   VM_ACCEL     tcg (software emulation, the default) or kvm (where /dev/kvm exists)
#   VM_CPU       qemu's -cpu (default max)
#   VM_SMP       virtual CPUs (default 2)
#   VM_MEM       memory in MiB (default 3072)
#   VM_TIMEOUT   seconds until the VM is killed (default 1500)
#   VM_APPEND    more kernel command line
#   VM_APISERVER_PORT  a port on the host's 127.0.0.1 (kube-apiserver's, test/vm/controlplane):
#                the guest gets a virtio NIC on qemu's user-mode network with restrict=on (no
#                route out) whose only way out is 10.0.2.100:6443, forwarded (guestfwd, one socat
#                per connection) to 127.0.0.1:PORT on the host
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
VM_DIR=${PODGATE_VM_DIR:-$RIG_DIR/vm}
VM_ACCEL=${VM_ACCEL:-tcg}
VM_CPU=${VM_CPU:-max}
VM_SMP=${VM_SMP:-2}
VM_MEM=${VM_MEM:-3072}
VM_TIMEOUT=${VM_TIMEOUT:-1500}
VM_APPEND=${VM_APPEND:-}

log() { printf 'vm run: %s\n' "$*" >&2; }

[ $# -ge 2 ] || {
	log "usage: run.sh SCRIPT OUT [FILE...]"
	exit 2
}
script=$1
out=$(realpath -m "$2")
shift 2
for f in "$VM_DIR/node.img" "$VM_DIR/vmlinuz" "$VM_DIR/initrd.img" "$script" "$@"; do
	[ -e "$f" ] || {
		log "$f missing (the image: test/vm/install.sh)"
		exit 2
	}
done

# The share: the script as run.sh, the files, and out/ for what comes back.
share=$(mktemp -d /tmp/podgate-vm-share.XXXXXX)
trap 'rm -rf "$share"' EXIT
install -m 0755 "$script" "$share/run.sh"
[ $# -eq 0 ] || cp "$@" "$share/"
mkdir -p "$share/out"
rm -rf "$out"
mkdir -p "$out"

accel=(-accel "$VM_ACCEL")
[ "$VM_ACCEL" != tcg ] || accel=(-accel tcg,thread=multi)
net=(-nic none)
if [ -n "${VM_APISERVER_PORT:-}" ]; then
	net=(-netdev "user,id=n0,restrict=on,guestfwd=tcp:10.0.2.100:6443-cmd:socat - TCP:127.0.0.1:$VM_APISERVER_PORT"
		-device virtio-net-pci,netdev=n0)
fi
# The root disk with snapshot=on: the guest's writes go to a temporary overlay, and every run
# starts from the same image. -no-reboot: the guest's poweroff (or a panic's reboot) ends qemu.
# -nodefaults: no CD-ROM, floppy or VGA to probe at boot.
start=$(date +%s.%N)
set +e
timeout --kill-after=10 "$VM_TIMEOUT" qemu-system-x86_64 \
	-machine q35 "${accel[@]}" -cpu "$VM_CPU" -smp "$VM_SMP" -m "$VM_MEM" \
	-kernel "$VM_DIR/vmlinuz" -initrd "$VM_DIR/initrd.img" \
	-append "console=ttyS0 root=/dev/vda rw systemd.unified_cgroup_hierarchy=1 panic=-1 $VM_APPEND" \
	-drive "file=$VM_DIR/node.img,format=raw,if=virtio,snapshot=on" \
	-virtfs "local,path=$share,mount_tag=share,security_model=passthrough,id=share" \
	-nodefaults "${net[@]}" -display none -monitor none -no-reboot \
	-serial "file:$out/console.log"
qemu_status=$?
set -e
end=$(date +%s.%N)
cp -r "$share/out/." "$out/" 2>/dev/null || true
printf 'accel %s cpu %s smp %s: qemu exit %s after %.1f s\n' "$VM_ACCEL" "$VM_CPU" "$VM_SMP" "$qemu_status" "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" >"$out/times.txt"
cat "$out/times.txt" >&2
if [ "$qemu_status" = 124 ] || [ "$qemu_status" = 137 ]; then
	log "the VM did not finish within ${VM_TIMEOUT}s; last console lines:"
	tail -n 20 "$out/console.log" >&2
	exit 124
fi
if [ ! -s "$out/status" ]; then
	log "the VM stopped without a status (qemu exit $qemu_status); last console lines:"
	tail -n 30 "$out/console.log" >&2
	exit 1
fi
exit "$(cat "$out/status")"

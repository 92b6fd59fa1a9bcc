#!/usr/bin/env bash
# install.sh: the VM lane's machine (issue 41): qemu-system-x86 and debootstrap from Debian, and a
# Debian 12 node image built once and cached outside the checkout, in $PODGATE_VM_DIR (default
# /var/lib/podgate-rig/vm):
#
#   rootfs/      debootstrap of bookworm with systemd as PID 1, Debian's kernel (its vmlinuz and
#                a small initrd are copied beside it), and what a node needs (iptables, iproute2,
#                util-linux, ca-certificates, kmod, conntrack, ...); rebuilt only when the package
#                list below changes (a stamp holds its sum)
#   vmlinuz, initrd.img
#   node.img     a raw ext4 image made with mkfs.ext4 -d (no loop mount, no privilege beyond
#                owning the files) of rootfs/ plus the rig's node binaries (containerd, shim,
#                runc, ctr, crictl, CNI plugins, the pause and busybox images, kubelet 1.37.2) and
#                test/vm/guest/'s units; rebuilt when any of those changes
#
# Needs root (apt-get, debootstrap) and the rig's node, tools and cluster parts
# (test/rig/install.sh). Idempotent. Prints what each step cost, for docs/development.md.
set -euo pipefail

RIG_DIR=${PODGATE_RIG_DIR:-/var/lib/podgate-rig}
VM_DIR=${PODGATE_VM_DIR:-$RIG_DIR/vm}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SUITE=bookworm
# The kubelet of the VM: the newest of the tested matrix, as on the host.
# shellcheck source=../matrix/versions.env
. "$HERE/../matrix/versions.env"
read -r -a KUBELETS <<<"$KUBELET_VERSIONS"
KUBELET_VERSION=${VM_KUBELET_VERSION:-${KUBELETS[-1]}}

log() { printf 'vm: %s\n' "$*" >&2; }

if [ "$(id -u)" != 0 ]; then
	log "must run as root (apt-get, debootstrap)"
	exit 1
fi

# Host packages: qemu (TCG or KVM), debootstrap, e2fsprogs for mkfs.ext4 -d, qemu-utils for
# qemu-img. --no-install-recommends: no GUI, no firmware beyond what qemu-system-x86 depends on.
# socat: run.sh's guestfwd to the host's kube-apiserver.
host_packages=(qemu-system-x86 qemu-utils debootstrap e2fsprogs socat)
missing=()
for p in "${host_packages[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "apt-get install ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The mirror apt uses on this host (deb822 or one-line sources), unless VM_MIRROR says.
mirror() {
	local m
	m=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	[ -n "$m" ] || m=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
	echo "${VM_MIRROR:-${m:-http://deb.debian.org/debian}}"
}

# What a node needs inside: systemd as PID 1 (systemd-sysv), dbus (systemctl talks to it, the
# kubelet's systemd cgroup driver too), udev, the kernel, iptables/iproute2/conntrack (CNI and
# the kubelet), util-linux (mount, nsenter), e2fsprogs, kmod, procps, ca-certificates; dpkg and
# apt are in minbase (apt install ./podgate_*.deb). For the tests: curl and jq (the API
# server's REST API), socat (the guest's end of the forward to it).
guest_packages=(systemd systemd-sysv dbus udev kmod iptables iproute2 conntrack util-linux mount
	e2fsprogs procps ca-certificates ethtool socat init-system-helpers less curl jq)
# ROOTFS_REVISION: raise it when build_rootfs changes in a way the package list does not show.
ROOTFS_REVISION=1
stamp=$(printf '%s\n' "$SUITE" "${guest_packages[@]}" "$ROOTFS_REVISION" | sha256sum | cut -c1-16)

build_rootfs() {
	local tmp=$VM_DIR/rootfs.tmp start=$SECONDS
	rm -rf "$tmp"
	mkdir -p "$tmp/etc/initramfs-tools/conf.d"
	# A small initrd: the modules to mount an ext4 root on virtio-blk, not "most" of them (an
	# initrd of ~8 MiB instead of ~40: it is unpacked under software emulation at every boot).
	log "debootstrap $SUITE from $(mirror) (a few minutes)"
	debootstrap --variant=minbase --include="$(
		IFS=,
		echo "${guest_packages[*]}"
	)" "$SUITE" "$tmp" "$(mirror)" >"$VM_DIR/debootstrap.log" 2>&1 || {
		tail -20 "$VM_DIR/debootstrap.log" >&2
		exit 1
	}
	printf 'MODULES=list\nCOMPRESS=gzip\n' >"$tmp/etc/initramfs-tools/conf.d/podgate-vm.conf"
	printf '%s\n' virtio_pci virtio_blk ext4 >>"$tmp/etc/initramfs-tools/modules"
	# The kernel, in a second step: its postinst builds the initrd with the settings above.
	log "kernel into the root filesystem"
	chroot "$tmp" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-image-amd64 >>"$VM_DIR/debootstrap.log" 2>&1 || {
		tail -20 "$VM_DIR/debootstrap.log" >&2
		exit 1
	}
	chroot "$tmp" apt-get clean
	# Nothing in the guest needs a password or a network login; the serial console's root login
	# stays open for debugging by hand (VM_INTERACTIVE=1 test/vm/run.sh).
	chroot "$tmp" passwd -d root >/dev/null
	echo podgate-vm >"$tmp/etc/hostname"
	rm -rf "$tmp"/var/lib/apt/lists/*
	rm -rf "$VM_DIR/rootfs"
	mv "$tmp" "$VM_DIR/rootfs"
	echo "$stamp" >"$VM_DIR/rootfs.version"
	log "root filesystem built in $((SECONDS - start)) s"
}

mkdir -p "$VM_DIR"
if [ "$(cat "$VM_DIR/rootfs.version" 2>/dev/null)" != "$stamp" ] || [ ! -d "$VM_DIR/rootfs/etc" ]; then
	build_rootfs
fi
cp -L "$VM_DIR/rootfs/vmlinuz" "$VM_DIR/vmlinuz"
cp -L "$VM_DIR/rootfs/initrd.img" "$VM_DIR/initrd.img"

# The node image: the root filesystem, the rig's binaries and the guest's files. Its sum covers
# every input, so a rebuilt rig binary or an edited guest unit makes a new image.
kubelet=$RIG_DIR/cluster/kubelet/$KUBELET_VERSION/kubelet
inputs=("$RIG_DIR/bin/containerd" "$RIG_DIR/bin/containerd-shim-runc-v2" "$RIG_DIR/bin/runc"
	"$RIG_DIR/bin/ctr" "$RIG_DIR/bin/crictl" "$kubelet" "$RIG_DIR/images/pause.tar" "$RIG_DIR/images/busybox.tar")
for f in "${inputs[@]}"; do
	[ -e "$f" ] || {
		log "$f missing: run test/rig/install.sh node tools cluster first"
		exit 1
	}
done
img_sum=$( (
	echo "$stamp"
	stat -L -c '%n %s %Y' "${inputs[@]}" /usr/lib/cni/*
	find "$HERE/guest" -type f -print0 | sort -z | xargs -0 sha256sum
) | sha256sum | cut -c1-16)
if [ "$(cat "$VM_DIR/node.img.version" 2>/dev/null)" != "$img_sum" ] || [ ! -s "$VM_DIR/node.img" ]; then
	start=$SECONDS
	stage=$VM_DIR/stage
	rm -rf "$stage"
	# A copy with hard links (cp -al): the root filesystem stays clean, nothing is copied twice.
	cp -al "$VM_DIR/rootfs" "$stage"
	install -d "$stage/usr/local/bin" "$stage/opt/cni/bin" "$stage/opt/podgate-vm/images"
	for b in containerd containerd-shim-runc-v2 runc ctr crictl; do
		install -m 0755 "$RIG_DIR/bin/$b" "$stage/usr/local/bin/$b"
	done
	install -m 0755 "$kubelet" "$stage/usr/local/bin/kubelet"
	cp -L /usr/lib/cni/* "$stage/opt/cni/bin/"
	cp -L "$RIG_DIR/images/pause.tar" "$RIG_DIR/images/busybox.tar" "$stage/opt/podgate-vm/images/"
	# The guest's own files (units, containerd and kubelet configuration, the runner) overlay the
	# root filesystem as they are laid out under guest/; --remove-destination: a file of rootfs/
	# (a hard link in the stage) is replaced, never written through.
	cp -r --remove-destination --no-preserve=ownership "$HERE/guest/." "$stage/"
	systemctl --root="$stage" enable podgate-vm-run.service containerd.service >/dev/null 2>&1
	size_mb=$(($(du -sm "$stage" | cut -f1) + 1536))
	rm -f "$VM_DIR/node.img.tmp"
	mkfs.ext4 -q -F -L podgate-root -d "$stage" "$VM_DIR/node.img.tmp" "${size_mb}M"
	mv "$VM_DIR/node.img.tmp" "$VM_DIR/node.img"
	rm -rf "$stage"
	echo "$img_sum" >"$VM_DIR/node.img.version"
	log "node image ($size_mb MiB) built in $((SECONDS - start)) s"
fi
log "ready in $VM_DIR"

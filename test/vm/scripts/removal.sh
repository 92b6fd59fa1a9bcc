#!/bin/bash
# removal.sh: the VM lane's last part (test/vm), sourced by node.sh after kubelet.sh (and
# api.sh): podgate removed as the runbook says (docs/runbook.md, "Install from the package"),
# with the kubelet's pods running: first the kubelet back to containerd (the drop-in removed, the
# kubelet restarted), then apt remove (podgate stopped, the unit masked, the conffiles and
# /var/lib/podgate kept), then apt purge (all of them gone); the pods' containers the same
# throughout. Uses kubelet.sh's snapshot.
set -u

section "removal as the runbook says"
before=$(snapshot)
# First the kubelet back to containerd, then the package away.
rm /etc/kubernetes/kubelet.conf.d/50-podgate.conf
systemctl restart kubelet
if DEBIAN_FRONTEND=noninteractive apt-get remove -y podgate; then ok "apt remove podgate"; else fail "apt remove podgate"; fi
check "podgate stopped after remove" sh -c '! systemctl is-active podgate'
echo "is-enabled after remove: $(systemctl is-enabled podgate 2>&1)"
[ -f /etc/podgate/config.yaml ] && ok "remove keeps the conffile /etc/podgate/config.yaml" || fail "remove took /etc/podgate/config.yaml"
[ -d /var/lib/podgate ] && ok "remove keeps /var/lib/podgate" || fail "remove took /var/lib/podgate"
if DEBIAN_FRONTEND=noninteractive apt-get purge -y podgate; then ok "apt purge podgate"; else fail "apt purge podgate"; fi
[ ! -e /etc/podgate ] && [ ! -e /var/lib/podgate ] && ok "purge removes /etc/podgate and /var/lib/podgate" || fail "purge left: $(ls -d /etc/podgate /var/lib/podgate 2>/dev/null)"
echo "is-enabled after purge: $(systemctl is-enabled podgate 2>&1)"
sleep 20
CRI_DIRECT=(--runtime-endpoint unix:///run/containerd/containerd.sock --image-endpoint unix:///run/containerd/containerd.sock)
after=$(for c in $(crictl "${CRI_DIRECT[@]}" ps -q); do crictl "${CRI_DIRECT[@]}" inspect -o go-template --template '{{.status.id}} {{.info.pid}} {{.status.metadata.attempt}}' "$c"; done | grep . | sort)
[ "$after" = "$before" ] && ok "kubelet back on containerd, podgate purged: 0 containers restarted" || fail "after removal: before [$before] after [$after]"
# The end: the kubelet stopped, then its pods through containerd (StopPodSandbox kills at once),
# so that the poweroff does not wait out systemd's 90 s for each scope of a sleep that, as PID 1
# of its container, ignores SIGTERM.
systemctl stop kubelet
for p in $(crictl "${CRI_DIRECT[@]}" pods -q); do
	crictl "${CRI_DIRECT[@]}" stopp "$p" >/dev/null && crictl "${CRI_DIRECT[@]}" rmp "$p" >/dev/null
done

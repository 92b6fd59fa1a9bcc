// Package vm holds the VM lane (make vm-test, issue 41): a Debian 12 node with systemd, cgroup v2
// and the systemd cgroup driver, built by install.sh and booted under qemu by run.sh, where
// scripts/ run podgate from its package beside containerd and the kubelet (vm-test.sh;
// docs/development.md, "The VM lane"). Its Go tests check the lane's own files without booting
// anything, so that make test keeps them sound between runs of the lane.
package vm

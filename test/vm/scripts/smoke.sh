#!/bin/bash
# smoke.sh: the VM lane's first contact (test/vm): systemd as PID 1, cgroup v2, the CPU benchmark.
set -u
echo "pid 1: $(cat /proc/1/comm)"
echo "cgroup fs: $(stat -fc %T /sys/fs/cgroup)"
systemctl is-system-running || true
systemd-analyze time
"$(dirname "$0")/cpubench.sh" | tee "$OUT/cpubench.txt"

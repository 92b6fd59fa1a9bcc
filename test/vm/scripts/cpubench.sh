#!/bin/bash
# cpubench.sh: a small CPU benchmark run the same way on the host and in the guest (test/vm,
# BENCHMARKS.md "The VM lane"): hashing 128 MiB of zeros (sha256sum, plain C in coreutils), and
# 200,000 rounds of bash arithmetic (the interpreter: branches and calls, not arithmetic units).
# Prints "NAME SECONDS" lines, each the best of three runs.
set -eu
best() {
	local name=$1 b=999999 s e t
	shift
	for _ in 1 2 3; do
		s=$(date +%s%N)
		"$@" >/dev/null
		e=$(date +%s%N)
		t=$(((e - s) / 1000000))
		[ "$t" -lt "$b" ] && b=$t
	done
	printf '%s %d.%03d\n' "$name" $((b / 1000)) $((b % 1000))
}
hash() { head -c 134217728 /dev/zero | sha256sum; }
loop() {
	local i=0 x=0
	while [ $i -lt 200000 ]; do
		x=$(((x * 31 + i) % 1000003))
		i=$((i + 1))
	done
	echo $x
}
best sha256-128MiB hash
best bash-loop-200k loop

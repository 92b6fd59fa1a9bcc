// Package matrix is podgate's tested version matrix: the kubelet and containerd releases in
// versions.env, which run.sh runs the core of the real-stack tests on (make matrix; make test's
// skew lane on the oldest pair). Its test keeps the file, the build scripts and the range podgate
// itself calls tested in step (agent/compat checks its range against ReadVersions).
package matrix

// Package compat holds the kubelet and runtime releases podgate is tested with — the version
// matrix of test/matrix, which make matrix runs — and says where a node's kubelet or runtime
// stands against it. podgate logs what it sees at start-up, warns outside the tested range and
// exports the verdict as a metric; it never refuses to run: a CRI proxy that stopped a node's
// kubelet from starting over a version number would be worse than one running untested.
package compat

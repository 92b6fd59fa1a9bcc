// Package state reads podgate's state on disk at start-up: the pod registry's checkpoint with
// every feature's section registered (the DRA claims, the attach records, the sysctl records).
// It is the composition root's: the one place that knows which features keep records, so that
// a checkpoint is written back byte for byte as it was read (its golden files in testdata/
// hold every format podgate has written).
package state

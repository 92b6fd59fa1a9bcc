// Package rig runs a real containerd for podgate's end-to-end tests and demo: containerd v2.4
// with runc, the CNI bridge plugin and the locally built pause and busybox images, each instance
// with its own root, state, socket, CNI network and logs in one short directory under /tmp.
//
// Tests call [Start], which skips unless the test runs as root on a machine where
// test/rig/install.sh (make rig) has run, and tears the instance down at the end of the test:
//
//	r := rig.Start(t)
//	c := rig.Connect(t, r.Endpoint) // or podgate's socket, once podgate fronts r.Endpoint
//	id, err := c.Runtime.RunPodSandbox(ctx, cfg, "")
//
// Programs (the demo) use [Up] and [Rig.Down]. Both run the shell scripts up.sh and down.sh of
// this directory, embedded in the package, so there is one way to start and stop a rig whether
// from Go or by hand:
//
//	sudo test/rig/up.sh /tmp/pgr-demo    # prints unix:///tmp/pgr-demo/containerd.sock
//	sudo test/rig/down.sh /tmp/pgr-demo
//
// Each instance claims its own bridge and pod subnet (pgrigN, 10.77.N.0/24; see [Rig.Subnet]), so
// several rigs may run at once, as they do when go test runs packages in parallel. Pods get no
// default route and no masquerading: traffic stays between the host and the rig's own pods.
package rig

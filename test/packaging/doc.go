// Package packaging tests what `make package` and `make release` make: the .deb and .rpm of
// podgate (their files, conffiles and maintainer scripts), the SBOM and SHA256SUMS, and, as root
// with dpkg, the .deb installed on this machine, upgraded with an edited config, removed and
// purged, and upgraded in place under running pods of a real containerd.
//
// The install tests write into /usr/bin, /etc and /lib/systemd/system: each purges the package
// when it ends, and none runs when a podgate package or file is already on the machine.
package packaging

package cgroup

import (
	"testing"

	"github.com/containerd/errdefs"
)

func TestDriver(t *testing.T) {
	for _, tc := range []struct {
		path, want string
	}{
		{"kubepods-besteffort-pod123.slice:cri-containerd:abc", DriverSystemd},
		{"system.slice:docker:1234", DriverSystemd},
		{":cri-containerd:abc", DriverSystemd}, // runc's default slice
		{"/kubepods/besteffort/pod123/abc", DriverCgroupfs},
		{"/kubepods.slice:cri-containerd:abc", DriverCgroupfs}, // absolute: a path
		{"kubepods/abc", DriverCgroupfs},
		{"a:b:c", DriverCgroupfs}, // not a slice
		{"a.slice:b", DriverCgroupfs},
		{"kubepods-burstable-pod123.slice", DriverSystemd}, // a pod's cgroup parent
		{"", DriverCgroupfs},
	} {
		if got := Driver(tc.path); got != tc.want {
			t.Errorf("Driver(%q) = %q, want %q", tc.path, got, tc.want)
		}
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		want       groupPath
		invalid    bool
	}{
		{name: "cgroupfs", path: "/kubepods/besteffort/pod123/abc", want: groupPath{"/kubepods/besteffort/pod123/abc", DriverCgroupfs}},
		{name: "systemd besteffort", path: "kubepods-besteffort-pod123.slice:cri-containerd:abc",
			want: groupPath{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod123.slice/cri-containerd-abc.scope", DriverSystemd}},
		{name: "systemd guaranteed", path: "kubepods-pod9.slice:cri-containerd:abc",
			want: groupPath{"/kubepods.slice/kubepods-pod9.slice/cri-containerd-abc.scope", DriverSystemd}},
		{name: "systemd default slice", path: ":runc:x", want: groupPath{"/system.slice/runc-x.scope", DriverSystemd}},
		{name: "systemd root slice", path: "-.slice:p:x", want: groupPath{"/p-x.scope", DriverSystemd}},
		{name: "systemd slice unit", path: "a.slice:p:a-b.slice", want: groupPath{"/a.slice/a-b.slice", DriverSystemd}},
		{name: "systemd dots are a name", path: "a.slice:..:..", want: groupPath{"/a.slice/..-...scope", DriverSystemd}},
		{name: "systemd pod cgroup parent", path: "kubepods-burstable-pod123.slice",
			want: groupPath{"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod123.slice", DriverSystemd}},
		{name: "systemd top slice", path: "kubepods.slice", want: groupPath{"/kubepods.slice", DriverSystemd}},
		{name: "systemd bare root slice", path: "-.slice", invalid: true},
		{name: "systemd bare slice empty component", path: "a--b.slice", invalid: true},
		{name: "empty", path: "", invalid: true},
		{name: "NUL", path: "/kubepods/a\x00b", invalid: true},
		{name: "dot-dot", path: "/kubepods/../../etc", invalid: true},
		{name: "dot-dot at root", path: "/../etc", invalid: true},
		{name: "not clean", path: "/kubepods//abc", invalid: true},
		{name: "trailing slash", path: "/kubepods/abc/", invalid: true},
		{name: "dot", path: "/kubepods/./abc", invalid: true},
		{name: "relative", path: "kubepods/abc", invalid: true},
		{name: "root", path: "/", invalid: true},
		{name: "host path", path: "/sys/fs/cgroup/memory/x", invalid: true},
		{name: "systemd slash in name", path: "a.slice:p:../../x", invalid: true},
		{name: "systemd slash in prefix", path: "a.slice:../..:x", invalid: true},
		{name: "systemd empty component", path: "a--b.slice:p:x", invalid: true},
		{name: "systemd leading dash", path: "-a.slice:p:x", invalid: true},
		{name: "systemd bare suffix", path: ".slice:p:x", invalid: true},
		{name: "systemd no name", path: "a.slice:p:", invalid: true},
		{name: "systemd NUL", path: "a.slice:p:x\x00", invalid: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolve(tc.path)
			if tc.invalid {
				if !errdefs.IsInvalidArgument(err) {
					t.Fatalf("resolve(%q) = %+v, %v; want an invalid-argument error", tc.path, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("resolve(%q) = %+v, %v; want %+v", tc.path, got, err, tc.want)
			}
		})
	}
}

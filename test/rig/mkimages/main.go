// Command mkimages builds the rig's two container images as docker-archive tarballs that
// `ctr images import` reads: the pause image (a static Go binary, see ../pause) and a busybox
// image from Debian's busybox-static. No registry is reachable on the test machines, so the
// images the node needs are made here.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Image names the rig's containerd and the tests expect.
const (
	PauseImage   = "registry.k8s.io/pause:3.10"
	BusyboxImage = "docker.io/library/busybox:1.35"
)

func main() {
	out := flag.String("out", "", "directory to write pause.tar and busybox.tar into")
	busybox := flag.String("busybox", "/bin/busybox", "a statically linked busybox binary")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "mkimages: -out is required")
		os.Exit(2)
	}
	if err := run(*out, *busybox); err != nil {
		fmt.Fprintln(os.Stderr, "mkimages:", err)
		os.Exit(1)
	}
}

func run(out, busybox string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	pause, err := buildPause()
	if err != nil {
		return fmt.Errorf("build pause: %w", err)
	}
	if err := writeImage(filepath.Join(out, "pause.tar"), PauseImage, []entry{
		{name: "pause", mode: 0o755, data: pause},
	}, []string{"/pause"}, nil); err != nil {
		return err
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	applets, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", busybox, err)
	}
	files := []entry{
		{name: "bin/", dir: true, mode: 0o755},
		{name: "bin/busybox", mode: 0o755, data: bb},
		{name: "tmp/", dir: true, mode: 0o1777},
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnogroup:x:65534:\n")},
	}
	for _, a := range strings.Fields(string(applets)) {
		if a != "busybox" {
			files = append(files, entry{name: "bin/" + a, link: "busybox"})
		}
	}
	return writeImage(filepath.Join(out, "busybox.tar"), BusyboxImage, files, nil, []string{"/bin/sh"})
}

func buildPause() ([]byte, error) {
	dir, err := os.MkdirTemp("", "pause")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "./test/rig/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, err
	}
	return os.ReadFile(bin)
}

type entry struct {
	name string
	dir  bool
	link string
	mode int64
	data []byte
}

func writeImage(path, ref string, files []entry, entrypoint, cmd []string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(f.data))}
		switch {
		case f.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case f.link != "":
			h.Typeflag, h.Linkname, h.Mode, h.Size = tar.TypeSymlink, f.link, 0o777, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	layerBytes := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerBytes)), nil
	})
	if err != nil {
		return err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config = v1.Config{Entrypoint: entrypoint, Cmd: cmd, Env: []string{"PATH=/bin"}}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	return tarball.WriteToFile(path, tag, img)
}

package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"
	"k8s.io/klog/v2"
)

// Run watches the plugin registry and keeps the set current until ctx ends, then returns nil;
// it returns an error at once if the directory cannot be created or watched, or later if the
// watch itself breaks. A socket that does not answer is never an error of Run's. Run may be
// called once. When it returns, the set stays as it was until [Drivers.Close].
//
// How file events map to the set, as in the kubelet's plugin watcher:
//
//   - a socket created (or found by the first scan) is asked GetInfo;
//   - a directory created is watched too, and scanned;
//   - a socket or directory removed or renamed away: its registrations are forgotten;
//   - a socket whose mode or contents change is asked again at once;
//   - names starting with "." are ignored, and symbolic links are not followed;
//   - if the kernel's event queue overflowed, the directory is scanned again.
func (d *Drivers) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("dra: Drivers.Run called twice")
	}
	logger := klog.FromContext(ctx).WithValues("pluginRegistry", d.dir)
	ctx = klog.NewContext(ctx, logger)
	// Like the kubelet: a driver that starts before the kubelet has made the directory finds it.
	if err := os.MkdirAll(d.dir, 0o755); err != nil {
		return fmt.Errorf("plugin registry: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch plugin registry: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		d.workers.Wait()
		_ = w.Close()
		d.closeSynced()
	}()

	var initial sync.WaitGroup
	if err := d.scan(ctx, w, d.dir, &initial); err != nil {
		return err
	}
	go func() {
		initial.Wait()
		d.closeSynced()
	}()
	logger.V(2).Info("Watching the plugin registry for DRA drivers")
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("watch plugin registry: event channel closed")
			}
			d.handle(ctx, w, ev)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("watch plugin registry: error channel closed")
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				logger.Info("Plugin registry events were lost, scanning again", "err", err)
				d.rescan(ctx, w)
				continue
			}
			logger.Error(err, "Watching the plugin registry")
		}
	}
}

// handle applies one file event.
func (d *Drivers) handle(ctx context.Context, w *fsnotify.Watcher, ev fsnotify.Event) {
	logger := klog.FromContext(ctx)
	logger.V(6).Info("Plugin registry event", "event", ev)
	switch {
	case ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename):
		// A watch of a directory moved away would report its old path: drop it. Not a
		// directory, or already gone with it: nothing to drop.
		_ = w.Remove(ev.Name)
		if ev.Name == d.dir {
			// The kubelet's own watch is gone with it: drivers that register in a new
			// directory are seen by neither until restarted.
			logger.Error(nil, "The plugin registry directory went away; restart podgate (and the kubelet) once it is back")
		}
		for _, p := range d.forget(logger, ev.Name) {
			logger.V(2).Info("Registration socket removed", "socket", p)
			d.event("forgotten", p)
		}
	case ev.Has(fsnotify.Create):
		d.consider(ctx, w, ev.Name, nil, true)
	case ev.Has(fsnotify.Chmod) || ev.Has(fsnotify.Write):
		d.mu.Lock()
		s, ok := d.sockets[ev.Name]
		d.mu.Unlock()
		if ok {
			s.poke()
		}
	}
}

// scan watches dir and considers everything in it. Watching first means nothing created
// meanwhile is missed; what is seen twice is asked once.
func (d *Drivers) scan(ctx context.Context, w *fsnotify.Watcher, dir string, initial *sync.WaitGroup) error {
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("scan %s: %w", dir, err)
	}
	for _, e := range entries {
		d.consider(ctx, w, filepath.Join(dir, e.Name()), initial, false)
	}
	return nil
}

// rescan brings the set back in line with the directory after lost events: sockets gone are
// forgotten, new ones asked.
func (d *Drivers) rescan(ctx context.Context, w *fsnotify.Watcher) {
	logger := klog.FromContext(ctx)
	d.mu.Lock()
	paths := make([]string, 0, len(d.sockets))
	for p := range d.sockets {
		paths = append(paths, p)
	}
	d.mu.Unlock()
	for _, p := range paths {
		if fi, err := os.Lstat(p); err != nil || fi.Mode().Type() != fs.ModeSocket {
			d.forget(logger, p)
			d.event("forgotten", p)
		}
	}
	if err := d.scan(ctx, w, d.dir, nil); err != nil {
		logger.Error(err, "Scanning the plugin registry again")
	}
}

// consider looks at one path: a directory is watched and scanned, a socket asked GetInfo
// (again, if poke and it is known already), anything else ignored.
func (d *Drivers) consider(ctx context.Context, w *fsnotify.Watcher, path string, initial *sync.WaitGroup, poke bool) {
	logger := klog.FromContext(ctx)
	if strings.HasPrefix(filepath.Base(path), ".") {
		logger.V(5).Info("Ignoring hidden file in the plugin registry", "path", path)
		d.event("skipped", path)
		return
	}
	fi, err := os.Lstat(path)
	if err != nil {
		// Gone again already; its removal is (or was) an event of its own.
		logger.V(5).Info("Plugin registry entry vanished", "path", path, "err", err)
		return
	}
	switch {
	case fi.IsDir():
		if err := d.scan(ctx, w, path, initial); err != nil {
			logger.Error(err, "Cannot watch a plugin registry sub-directory", "path", path)
		}
	case fi.Mode().Type() == fs.ModeSocket:
		d.track(ctx, path, initial, poke)
	default:
		logger.V(5).Info("Ignoring plugin registry entry that is not a socket", "path", path, "mode", fi.Mode())
		d.event("skipped", path)
	}
}

// track starts watching the registration socket at path, or pokes the watch it has.
func (d *Drivers) track(ctx context.Context, path string, initial *sync.WaitGroup, poke bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s, ok := d.sockets[path]; ok {
		if poke {
			s.poke()
		}
		return
	}
	sctx, cancel := context.WithCancel(ctx)
	s := &regSocket{path: path, cancel: cancel, kick: make(chan struct{}, 1)}
	d.sockets[path] = s
	first := func() {}
	if initial != nil {
		initial.Add(1)
		first = sync.OnceFunc(initial.Done)
	}
	d.workers.Add(1)
	go d.watchSocket(sctx, s, first)
}

// poke asks the socket's watch to look again now.
func (s *regSocket) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// under reports whether p is path or inside it.
func under(p, path string) bool {
	return p == path || strings.HasPrefix(p, path+string(filepath.Separator))
}

package podresources

import (
	"sync"

	pb "github.com/podgate/podgate/podresources/api/v1alpha1"
)

// Watch limits: how many watches run at once, and how many events a watcher may fall behind
// before it is ended. Together they bound what slow or idle watchers make podgate hold.
const (
	DefaultMaxWatchers   = 64
	DefaultWatcherBuffer = 256
)

// Broadcaster hands the pod registry's changes to the running watches. The agent publishes
// every change, in revision order; Publish never blocks, so it may be called under the lock
// that orders the changes. Events are shared between watchers and must not be changed once
// published.
type Broadcaster struct {
	buffer, max int

	mu       sync.Mutex
	watchers map[*watcher]struct{}
	// running counts the watches whose handler has not returned, dropped ones included: a
	// dropped watch may still be blocked sending to a client that does not read, and must
	// keep its slot so that such clients cannot pile up handlers past max.
	running int
	closed  bool
	onDrop  func() // counts a watcher ended for falling behind
}

// watcher is one running watch: events arrive on ch until it is closed, by the watch's end,
// by Close, or because the watcher fell behind (dropped).
type watcher struct {
	ch      chan *pb.WatchEvent
	dropped bool // guarded by Broadcaster.mu; set before ch is closed
	ended   bool // guarded by Broadcaster.mu: unsubscribe ran
}

// NewBroadcaster returns a broadcaster for at most maxWatchers watches, each ended once
// buffer events wait for it.
func NewBroadcaster(maxWatchers, buffer int) *Broadcaster {
	return &Broadcaster{buffer: buffer, max: maxWatchers, watchers: map[*watcher]struct{}{}, onDrop: func() {}}
}

// Publish hands ev to every watcher. A watcher whose buffer is full is dropped: its channel
// is closed and its watch ends with ResourceExhausted.
func (b *Broadcaster) Publish(ev *pb.WatchEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for w := range b.watchers {
		select {
		case w.ch <- ev:
		default:
			w.dropped = true
			// What it has not taken it will never send: let it go, so that a dropped
			// watch holds at most the event it is sending.
		drain:
			for {
				select {
				case <-w.ch:
				default:
					break drain
				}
			}
			close(w.ch)
			delete(b.watchers, w)
			b.onDrop()
		}
	}
}

// Close ends every watch and refuses new ones (shutdown).
func (b *Broadcaster) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	for w := range b.watchers {
		close(w.ch)
		delete(b.watchers, w)
	}
}

// subscribe starts a watcher; ok is false when maxWatchers run already or the broadcaster
// is closed.
func (b *Broadcaster) subscribe() (w *watcher, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.running >= b.max {
		return nil, false
	}
	w = &watcher{ch: make(chan *pb.WatchEvent, b.buffer)}
	b.watchers[w] = struct{}{}
	b.running++
	return w, true
}

// unsubscribe ends a watcher whose watch returned, and frees its slot.
func (b *Broadcaster) unsubscribe(w *watcher) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !w.ended {
		w.ended = true
		b.running--
	}
	if _, ok := b.watchers[w]; ok {
		close(w.ch)
		delete(b.watchers, w)
	}
}

// wasDropped reports whether w was ended for falling behind, once its channel is closed.
func (b *Broadcaster) wasDropped(w *watcher) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return w.dropped
}

// Watchers returns how many watches run.
func (b *Broadcaster) Watchers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.watchers)
}

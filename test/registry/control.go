package registry

// What a test does to the registry's downloads: holds them before their first byte, pauses
// them part-way, trickles a blob, and the writer that paces each response.

import (
	"net/http"
	"time"
)

// Hold makes blob downloads wait, after their response headers and before the first byte of
// their body, until Release: pulls that started stay in flight, however long it takes to start
// the ones that are to wait behind them, on a machine as loaded as it may be. The headers go at
// once because containerd gives a registry 30 s to send them (its ResponseHeaderTimeout) and
// cancels the pull then; a body that sends nothing it bears for 5 minutes (CRI's
// image_pull_progress_timeout). Manifests are still served. As the throttle, it applies to what
// the registry counts (Count(true)), never to pushes.
func (r *Registry) Hold() { r.shut(&r.held) }

// Release lets the held downloads and every later one go.
func (r *Registry) Release() { r.open(&r.held) }

// Pause stops the blob downloads under way, and those that start, after their current chunk
// (32 KiB) until Resume: a pull stays in flight, part-way, however long the test takes to line
// others up behind it. Resumed downloads go on at the throttle's rate, without a burst to catch
// up.
func (r *Registry) Pause() { r.shut(&r.paused) }

// Resume lets the paused downloads go on.
func (r *Registry) Resume() { r.open(&r.paused) }

// Trickle serves the blob digest at bps bytes per second from now on, downloads under way
// included (from their next chunk), in chunks of a tenth of a second's worth, each flushed to
// the puller (but the last): a registry or proxy that is alive but too slow to use. bps 0 gives the blob the
// registry's bandwidth again.
func (r *Registry) Trickle(digest string, bps int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if bps <= 0 {
		delete(r.trickle, digest)
		return
	}
	if r.trickle == nil {
		r.trickle = map[string]int{}
	}
	r.trickle[digest] = bps
}

// rateOf is the bytes per second the blob digest is served at now.
func (r *Registry) rateOf(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if bps, ok := r.trickle[digest]; ok {
		return bps
	}
	return r.bandwidth
}

func (r *Registry) pausing() chan struct{} { return r.waitOn(&r.paused) }

func (r *Registry) holding() chan struct{} { return r.waitOn(&r.held) }

// shut gives the gate *g a channel unless it has one: downloads that look at it wait.
func (r *Registry) shut(g *chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if *g == nil {
		*g = make(chan struct{})
	}
}

// open closes the gate *g's channel, letting its waiters go, and forgets it.
func (r *Registry) open(g *chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if *g != nil {
		close(*g)
		*g = nil
	}
}

// waitOn is the channel to wait on while the gate *g is shut, nil while it is open.
func (r *Registry) waitOn(g *chan struct{}) chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return *g
}

// pacedWriter throttles a response to rate() bytes per second, read at each chunk, holds its
// body until hold is closed, and stops it while pause says so.
type pacedWriter struct {
	http.ResponseWriter
	rate func() int
	// hold, when not nil, is closed by Release: the body's first byte waits for it, its
	// headers are sent at once.
	hold <-chan struct{}
	// due is when the bytes written so far may all have gone at the rates they were sent at.
	due     time.Time
	written int64
	// pause returns the channel to wait on while the registry is paused, nil otherwise; done
	// is the request's end (the puller gave up).
	pause func() chan struct{}
	done  <-chan struct{}
	// kept is the last byte written, kept back until the next write or finish, and keeping
	// whether there is one: a puller that has the whole blob finds its request in the log.
	kept    byte
	keeping bool
}

// emit writes b to the response but for its last byte, which it keeps back (after writing the
// one it kept before).
func (p *pacedWriter) emit(b []byte) error {
	if p.keeping {
		if _, err := p.ResponseWriter.Write([]byte{p.kept}); err != nil {
			return err
		}
	}
	if _, err := p.ResponseWriter.Write(b[:len(b)-1]); err != nil {
		return err
	}
	p.kept, p.keeping = b[len(b)-1], true
	return nil
}

// finish writes the byte kept back: the response is whole. The registry calls it once it has
// logged the request.
func (p *pacedWriter) finish() {
	if p.keeping {
		_, _ = p.ResponseWriter.Write([]byte{p.kept}) // a puller gone has nothing to hear of it
		p.keeping = false
	}
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	const chunk = 32 << 10
	if p.hold != nil {
		if f, ok := p.ResponseWriter.(http.Flusher); ok {
			f.Flush() // the headers: the puller's wait for them ends
		}
		select {
		case <-p.hold:
			p.hold, p.due = nil, time.Now() // no burst to make up for the hold
		case <-p.done: // the puller gave up
			return 0, http.ErrAbortHandler
		}
	}
	n := 0
	for len(b) > 0 {
		bps := p.rate()
		c := min(chunk, max(1, bps/10), len(b))
		if err := p.emit(b[:c]); err != nil {
			return n, err
		}
		n += c
		p.written += int64(c)
		if f, ok := p.ResponseWriter.(http.Flusher); ok && c < chunk && len(b) > c {
			f.Flush() // a trickle's chunk goes on the wire now, however few bytes
		}
		b = b[c:]
		p.due = p.due.Add(time.Duration(float64(c) / float64(bps) * float64(time.Second)))
		select { // the throttle: this download may not run ahead of its rate
		case <-time.After(time.Until(p.due)):
		case <-p.done:
			return n, http.ErrAbortHandler
		}
		if ch := p.pause(); ch != nil {
			stopped := time.Now()
			select {
			case <-ch:
				p.due = p.due.Add(time.Since(stopped)) // no burst to make up for the pause
			case <-p.done:
				return n, http.ErrAbortHandler
			}
		}
	}
	return n, nil
}

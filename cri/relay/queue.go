package relay

import (
	"sync"

	"golang.org/x/net/http2/hpack"
)

// chunkSize is the size of the buffers a queue keeps bytes in: one frame's worth, the most
// podgate reads in one frame, so a chunk always leaves as one frame.
const chunkSize = maxFrame

// chunks are the queues' buffers, shared by every stream: bytes wait in them only while a
// reader is slower than its writer, and go back once written.
var chunks = sync.Pool{New: func() any { b := make([]byte, 0, chunkSize); return &b }}

// queue is what one direction of a stream holds for its reader's window: the bytes in pooled
// chunks, whatever frames they came in, and the header block or end that comes after them (a
// stream's data comes after its headers and before its trailers, so nothing else ever waits
// behind bytes).
type queue struct {
	data []*[]byte // filled chunks; the first one from off
	off  int
	size int64 // bytes waiting
	tail *item // trailers, or the end of the stream, after the bytes
}

func (q *queue) empty() bool { return q.size == 0 && q.tail == nil }

// push queues it after what waits; its bytes are copied (the framer reuses its buffer).
func (q *queue) push(it item) {
	for b := it.data; len(b) > 0; {
		if n := len(q.data); n == 0 || len(*q.data[n-1]) == chunkSize {
			q.data = append(q.data, chunks.Get().(*[]byte))
		}
		last := q.data[len(q.data)-1]
		room := chunkSize - len(*last)
		k := min(room, len(b))
		*last = append(*last, b[:k]...)
		b = b[k:]
		q.size += int64(k)
	}
	if it.headers != nil || it.end {
		tail := item{headers: it.headers, end: it.end, held: it.held}
		if tail.headers != nil {
			tail.headers = append([]hpack.HeaderField(nil), tail.headers...)
		}
		q.tail = &tail
	}
}

// pushChunk queues the bytes of c, a chunk of the pool the caller filled (its copy of bytes
// lent to it), without copying them again; end ends the stream after them. The queue owns c.
func (q *queue) pushChunk(c *[]byte, end bool) {
	n := len(*c)
	q.size += int64(n)
	switch k := len(q.data); {
	case n == 0:
		release([]*[]byte{c})
	case k > 0 && len(*q.data[k-1])+n <= chunkSize:
		// A small one joins the last chunk: a stream of tiny frames holds bytes, not chunks.
		last := q.data[k-1]
		*last = append(*last, *c...)
		release([]*[]byte{c})
	default:
		q.data = append(q.data, c)
	}
	if end {
		q.tail = &item{end: true}
	}
}

// take takes up to n bytes, as frames of a chunk at most, and the tail once no byte waits
// before it. The frames point into chunks: give back what take returns as done once they are
// written.
func (q *queue) take(n int64) (out []item, done []*[]byte) {
	for n > 0 && len(q.data) > 0 {
		c := q.data[0]
		b := (*c)[q.off:]
		k := min(int64(len(b)), n)
		out = append(out, item{data: b[:k]})
		n -= k
		q.size -= k
		q.off += int(k)
		if q.off == len(*c) { // all of it taken: the last chunk only when nothing waits
			done = append(done, c)
			q.data = q.data[1:]
			q.off = 0
		}
	}
	if q.size == 0 && q.tail != nil {
		if len(out) > 0 && q.tail.headers == nil {
			out[len(out)-1].end = true // the end rides on the last frame
		} else {
			out = append(out, *q.tail)
		}
		q.tail = nil
	}
	if len(q.data) == 0 {
		q.data = nil
	}
	return out, done
}

// drop empties q and returns how many bytes it held.
func (q *queue) drop() int64 {
	n := q.size
	release(q.data)
	*q = queue{}
	return n
}

// release gives chunks back to the pool.
func release(done []*[]byte) {
	for _, c := range done {
		*c = (*c)[:0]
		chunks.Put(c)
	}
}

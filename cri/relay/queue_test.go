package relay

import (
	"bytes"
	"testing"

	"golang.org/x/net/http2/hpack"
)

// TestQueue: bytes pushed in frames of any size come out in order, in frames of at most a
// chunk and as many bytes as taken; the trailers or the end come after the last byte (the end
// on the last frame), and drop gives everything back.
func TestQueue(t *testing.T) {
	var q queue
	var want []byte
	for i, n := range []int{1, 0, 3000, chunkSize, 7, chunkSize - 1, 2} {
		b := bytes.Repeat([]byte{byte(i + 1)}, n)
		want = append(want, b...)
		q.push(item{data: b})
	}
	if q.size != int64(len(want)) {
		t.Fatalf("size %d, want %d", q.size, len(want))
	}
	trailers := []hpack.HeaderField{{Name: "grpc-status", Value: "0"}}
	q.push(item{headers: trailers, end: true})

	var got []byte
	var tail *item
	for _, n := range []int64{0, 5, 20000, 1, 100000} {
		out, done := q.take(n)
		var took int64
		for _, it := range out {
			if it.headers != nil {
				tail = &it
				continue
			}
			if len(it.data) > chunkSize {
				t.Errorf("a frame of %d bytes, more than a chunk", len(it.data))
			}
			took += int64(len(it.data))
			got = append(got, it.data...)
		}
		if took > n {
			t.Errorf("take(%d) gave %d bytes", n, took)
		}
		release(done)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("got %d bytes, want the %d pushed, in order", len(got), len(want))
	}
	if tail == nil || !tail.end || tail.headers[0].Value != "0" {
		t.Errorf("tail %+v, want the trailers, ending the stream", tail)
	}
	if !q.empty() {
		t.Errorf("queue not empty after all was taken: %+v", q)
	}

	q.push(item{data: []byte("abc"), end: true})
	out, done := q.take(10)
	if len(out) != 1 || string(out[0].data) != "abc" || !out[0].end {
		t.Errorf("an end without trailers rides on the last frame: %+v", out)
	}
	release(done)

	q.push(item{data: make([]byte, 3*chunkSize)})
	if n := q.drop(); n != 3*chunkSize || !q.empty() {
		t.Errorf("drop gave back %d bytes, left %+v", n, q)
	}
}

package imagepull

import (
	"container/list"
	"iter"
)

// queue holds the waiting flights: one FIFO list per priority, ordered by arrival (seq).
type queue struct {
	byPrio [numPriorities]*list.List
	len    int
}

func newQueue() queue {
	var q queue
	for i := range q.byPrio {
		q.byPrio[i] = list.New()
	}
	return q
}

func (q *queue) push(f *flight) {
	f.elem = q.byPrio[f.prio].PushBack(f)
	q.len++
}

func (q *queue) remove(f *flight) {
	if f.elem == nil {
		return
	}
	q.byPrio[f.prio].Remove(f.elem)
	f.elem = nil
	q.len--
}

// raise moves a queued flight to a higher priority, where it takes its place by arrival: a
// critical pod joining an ordinary pod's pull lifts that pull past the ordinary queue.
func (q *queue) raise(f *flight, p Priority) {
	q.byPrio[f.prio].Remove(f.elem)
	f.prio = p
	l := q.byPrio[p]
	for e := l.Back(); e != nil; e = e.Prev() {
		if e.Value.(*flight).seq < f.seq {
			f.elem = l.InsertAfter(f, e)
			return
		}
	}
	f.elem = l.PushFront(f)
}

// first returns the first flight in queue order that may start, or nil.
func (q *queue) first(mayStart func(*flight) bool) *flight {
	for p := numPriorities - 1; p >= 0; p-- {
		for e := q.byPrio[p].Front(); e != nil; e = e.Next() {
			if f := e.Value.(*flight); mayStart(f) {
				return f
			}
		}
	}
	return nil
}

// position is f's 1-based place in queue order (ignoring registry caps).
func (q *queue) position(f *flight) int {
	n := 0
	for p := numPriorities - 1; p > int(f.prio); p-- {
		n += q.byPrio[p].Len()
	}
	for e := q.byPrio[f.prio].Front(); e != nil; e = e.Next() {
		n++
		if e == f.elem {
			break
		}
	}
	return n
}

// all is every queued flight, in no particular order.
func (q *queue) all() iter.Seq[*flight] {
	return func(yield func(*flight) bool) {
		for _, l := range q.byPrio {
			for e := l.Front(); e != nil; e = e.Next() {
				if !yield(e.Value.(*flight)) {
					return
				}
			}
		}
	}
}

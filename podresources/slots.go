package podresources

// What each client holds of the socket: its connections, its open calls and its watches,
// counted per process and per user inside the socket's totals, so that one process (or the
// processes of one user) cannot take every slot; and who holds the most, for the refusal's
// log line and the podgate_podresources_slots metric.

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// slotKind is what a slot is a slot of.
type slotKind int

const (
	kindConnections slotKind = iota
	kindStreams
	kindWatches
	numKinds
)

// String is the kind's name, in the metric's label and the refusal reasons.
func (k slotKind) String() string {
	return [...]string{"connections", "streams", "watches"}[k]
}

// quota is what the clients together, each user and each process may hold of one kind.
// Zero for total means no total (the socket's other limits bound it).
type quota struct {
	total, perUser, perProcess int
	// keys name the quotas in the refusals (the config keys).
	totalKey, perUserKey, perProcessKey string
}

// scope is which quota refused a slot.
type scope int

const (
	scopeSocket scope = iota
	scopeUser
	scopeProcess
)

// counts are what one client or user holds, by kind.
type counts [numKinds]int

// slots counts what each client holds, by process and by user.
type slots struct {
	quotas [numKinds]quota

	mu     sync.Mutex
	byPeer map[peerID]*counts
	byUser map[uint32]*counts
	total  counts
}

func newSlots(q [numKinds]quota) *slots {
	return &slots{quotas: q, byPeer: map[peerID]*counts{}, byUser: map[uint32]*counts{}}
}

// holder is who holds the slots of a kind that a client was refused: the client itself (over
// its process's quota), the process of its user that holds the most (over the user's), or
// the process that holds the most of all (over the socket's total).
type holder struct {
	kind  slotKind
	scope scope
	peer  peerID
	held  int // what peer holds of kind
	limit int
	key   string // the config key of the quota
}

// reason is the refusal's reason label: the kind, and which quota.
func (h *holder) reason() string {
	switch h.scope {
	case scopeProcess:
		return h.kind.String() + "_per_process"
	case scopeUser:
		return h.kind.String() + "_per_user"
	}
	return h.kind.String()
}

// keyValues are the log line's words about the holder.
func (h *holder) keyValues() []any {
	return []any{"holderPid", h.peer.pid, "holderUid", h.peer.uid, "holds", fmt.Sprintf("%d %s", h.held, h.kind), "quota", fmt.Sprintf("%s %d", h.key, h.limit)}
}

// acquire takes a slot of kind for p. It returns the release (which gives the slot back, once)
// or, when a quota is full, who holds its slots.
func (s *slots) acquire(p peerID, kind slotKind) (release func(), refused *holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.quotas[kind]
	mine, user := s.byPeer[p], s.byUser[p.uid]
	switch {
	case q.perProcess > 0 && mine != nil && mine[kind] >= q.perProcess:
		return nil, &holder{kind: kind, scope: scopeProcess, peer: p, held: mine[kind], limit: q.perProcess, key: q.perProcessKey}
	case q.total > 0 && s.total[kind] >= q.total:
		top, held := s.topLocked(kind, func(peerID) bool { return true })
		return nil, &holder{kind: kind, scope: scopeSocket, peer: top, held: held, limit: q.total, key: q.totalKey}
	case q.perUser > 0 && user != nil && user[kind] >= q.perUser:
		top, held := s.topLocked(kind, func(o peerID) bool { return o.uid == p.uid })
		return nil, &holder{kind: kind, scope: scopeUser, peer: top, held: held, limit: q.perUser, key: q.perUserKey}
	}
	if mine == nil {
		mine = &counts{}
		s.byPeer[p] = mine
	}
	if user == nil {
		user = &counts{}
		s.byUser[p.uid] = user
	}
	mine[kind]++
	user[kind]++
	s.total[kind]++
	var once sync.Once
	return func() { once.Do(func() { s.release(p, kind) }) }, nil
}

func (s *slots) release(p peerID, kind slotKind) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.total[kind]--
	if c := s.byPeer[p]; c != nil {
		if c[kind]--; *c == (counts{}) {
			delete(s.byPeer, p)
		}
	}
	if c := s.byUser[p.uid]; c != nil {
		if c[kind]--; *c == (counts{}) {
			delete(s.byUser, p.uid)
		}
	}
}

// topLocked is the client among those that match which holds the most of kind (the lowest
// pid among equals, so that the answer is stable). mu is held.
func (s *slots) topLocked(kind slotKind, match func(peerID) bool) (peerID, int) {
	var top peerID
	held := 0
	for p, c := range s.byPeer {
		if match(p) && (c[kind] > held || c[kind] == held && held > 0 && p.pid < top.pid) {
			top, held = p, c[kind]
		}
	}
	return top, held
}

// held is one client's holding of one kind, for the metric.
type held struct {
	peer peerID
	n    int
}

// tops returns, for each kind, the n clients that hold the most of it, most first.
func (s *slots) tops(n int) [numKinds][]held {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [numKinds][]held
	for kind := range numKinds {
		var all []held
		for p, c := range s.byPeer {
			if c[kind] > 0 {
				all = append(all, held{p, c[kind]})
			}
		}
		slices.SortFunc(all, func(a, b held) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.peer.pid, b.peer.pid)) })
		out[kind] = all[:min(n, len(all))]
	}
	return out
}

// topHolders is how many clients per kind podgate_podresources_slots shows: enough to name
// who holds a full socket, few enough that the series stay bounded.
const topHolders = 3

// slotsCollector exports podgate_podresources_slots: the slots the clients that hold the
// most hold, read when scraped, so that the metric names them while they hold them.
type slotsCollector struct {
	s    *slots
	desc *prometheus.Desc
}

var _ prometheus.Collector = slotsCollector{}

func newSlotsCollector(s *slots) slotsCollector {
	return slotsCollector{s: s, desc: prometheus.NewDesc("podgate_podresources_slots",
		"Slots of podgate's PodResources socket held by the processes that hold the most of each kind (connections, streams: open calls, watches), at most 3 per kind, by pid and uid.",
		[]string{"kind", "pid", "uid"}, nil)}
}

func (c slotsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c slotsCollector) Collect(ch chan<- prometheus.Metric) {
	for kind, hs := range c.s.tops(topHolders) {
		for _, h := range hs {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(h.n),
				slotKind(kind).String(), strconv.Itoa(int(h.peer.pid)), strconv.FormatUint(uint64(h.peer.uid), 10))
		}
	}
}

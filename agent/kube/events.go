package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// ReportingController is the reportingController of podgate's Events.
const ReportingController = "podgate.dev/podgate"

// The recorder's limits. They follow client-go's: the series of events.k8s.io (tools/events:
// an isomorphic Event within 6 minutes is a repeat) and the kubelet's spam filter (its
// EventCorrelator: a burst of 25 Events per object, then one every 5 minutes).
const (
	// seriesWindow: a repeat of an Event within it counts in the first Event's series.
	seriesWindow = 6 * time.Minute
	// seriesWriteInterval: the series of a repeated Event is written at most this often.
	seriesWriteInterval = 30 * time.Second
	// objectBurst and objectRefill are the per-object token bucket.
	objectBurst  = 25
	objectRefill = 5 * time.Minute
	// maxObjects bounds the per-object buckets kept; the oldest are forgotten past it.
	maxObjects = 4096
	// maxQueued bounds the Events waiting to be written; more are dropped, as client-go's
	// broadcaster drops them.
	maxQueued = 1000
	// writeTimeout bounds each write: one small object; an API server that does not answer
	// within it loses the Event (Events are best effort), and the next one is tried.
	writeTimeout = 10 * time.Second
	// maxNote is the API server's limit of an Event's note.
	maxNote = 1024
)

// Defaults of the node-wide write rate, the kubelet's eventRecordQPS and eventBurst scaled to
// what podgate writes.
const (
	DefaultEventQPS   = 5
	DefaultEventBurst = 25
)

// EventRecorder writes events.k8s.io/v1 Events about pods, as the kubelet's recorder does:
// a repeat of an Event (same object, type, reason, action and note) within 6 minutes counts in
// the first one's series instead of a new object; each object gets at most 25 Events in a
// burst, then one every 5 minutes; and the writes of the whole node are rate limited. Events
// are best effort: one that cannot be written is counted and dropped. Start it with Run.
type EventRecorder struct {
	sink     EventWriter
	instance string
	now      func() time.Time
	queue    chan write
	limiter  *rate.Limiter
	results  *prometheus.CounterVec

	mu      sync.Mutex
	objects map[types.UID]*objectLimit
	series  map[seriesKey]*series
}

type objectLimit struct {
	bucket *rate.Limiter
	used   time.Time
}

// seriesKey is what makes two Events the same Event.
type seriesKey struct {
	pod                       PodRef
	eventType, reason, action string
	note                      string
}

// series is an Event written, and its repeats.
type series struct {
	namespace, name string // empty until the Event is created
	first, last     time.Time
	count           int32
	written         int32 // the count the API server has
	lastWrite       time.Time
	pending         bool // a series write is queued
}

// write is one queued write: a new Event, or the series of one.
type write struct {
	event  *eventsv1.Event // a new Event
	series *series
	key    seriesKey
}

// Event results, the result label of podgate_events_total.
const (
	eventCreated   = "created"
	eventSeries    = "series_updated"
	eventRepeated  = "repeated"
	eventThrottled = "throttled"
	eventDropped   = "queue_full"
	eventFailed    = "error"
)

// EventOption configures an EventRecorder.
type EventOption func(*EventRecorder)

// WithEventRate sets the node-wide rate of Event writes (creates and series updates).
func WithEventRate(qps float64, burst int) EventOption {
	return func(r *EventRecorder) { r.limiter = rate.NewLimiter(rate.Limit(qps), burst) }
}

// WithEventMetrics registers podgate_events_total with reg.
func WithEventMetrics(reg prometheus.Registerer) EventOption {
	return func(r *EventRecorder) { reg.MustRegister(r.results) }
}

// NewEventRecorder creates a recorder that writes to sink as reportingInstance node.
func NewEventRecorder(sink EventWriter, node string, opts ...EventOption) *EventRecorder {
	r := &EventRecorder{
		sink: sink, instance: node, now: time.Now,
		queue:   make(chan write, maxQueued),
		limiter: rate.NewLimiter(DefaultEventQPS, DefaultEventBurst),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "podgate", Name: "events_total",
			Help: "Pod Events podgate reported, by result: created, series_updated (a repeat written to its Event's series), repeated (a repeat counted, written later or not), throttled (over the object's limit), queue_full, error (the API server refused it).",
		}, []string{"result"}),
		objects: map[types.UID]*objectLimit{},
		series:  map[seriesKey]*series{},
	}
	for _, o := range opts {
		o(r)
	}
	for _, res := range []string{eventCreated, eventSeries, eventRepeated, eventThrottled, eventDropped, eventFailed} {
		r.results.WithLabelValues(res)
	}
	return r
}

// PodRef is the pod an Event is about.
type PodRef struct {
	Namespace, Name string
	UID             types.UID
}

// Eventf reports an Event about pod: eventType corev1.EventTypeNormal or Warning, reason a
// short CamelCase word, action what podgate did or is doing. It does not block.
func (r *EventRecorder) Eventf(pod PodRef, eventType, reason, action, noteFormat string, args ...any) {
	if r == nil || pod.Namespace == "" || pod.Name == "" {
		return
	}
	note := truncate(fmt.Sprintf(noteFormat, args...), maxNote)
	now := r.now()
	key := seriesKey{pod: pod, eventType: eventType, reason: reason, action: action, note: note}
	r.mu.Lock()
	if !r.allow(pod.UID, now) {
		r.mu.Unlock()
		r.results.WithLabelValues(eventThrottled).Inc()
		return
	}
	if s, ok := r.series[key]; ok && now.Sub(s.last) < seriesWindow {
		s.count++
		s.last = now
		due := !s.pending && s.name != "" && now.Sub(s.lastWrite) >= seriesWriteInterval
		if due {
			s.pending = true
		}
		r.mu.Unlock()
		r.results.WithLabelValues(eventRepeated).Inc()
		if due {
			r.enqueue(write{series: s, key: key})
		}
		return
	}
	s := &series{first: now, last: now, count: 1, written: 1, lastWrite: now, pending: true}
	r.series[key] = s
	r.gc(now)
	r.mu.Unlock()
	r.enqueue(write{key: key, series: s, event: &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", pod.Name, now.UnixNano()),
			Namespace: pod.Namespace,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: ReportingController,
		ReportingInstance:   r.instance,
		Action:              action,
		Reason:              reason,
		Regarding:           corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Note:                note,
		Type:                eventType,
	}})
}

// allow takes a token of the object's bucket. r.mu is held.
func (r *EventRecorder) allow(uid types.UID, now time.Time) bool {
	o := r.objects[uid]
	if o == nil {
		if len(r.objects) >= maxObjects {
			var oldest types.UID
			var at time.Time
			for u, ol := range r.objects {
				if oldest == "" || ol.used.Before(at) {
					oldest, at = u, ol.used
				}
			}
			delete(r.objects, oldest)
		}
		o = &objectLimit{bucket: rate.NewLimiter(rate.Every(objectRefill), objectBurst)}
		r.objects[uid] = o
	}
	o.used = now
	return o.bucket.AllowN(now, 1)
}

// gc forgets the series whose last repeat is older than the window. r.mu is held.
func (r *EventRecorder) gc(now time.Time) {
	for k, s := range r.series {
		if now.Sub(s.last) >= seriesWindow && !s.pending {
			delete(r.series, k)
		}
	}
}

func (r *EventRecorder) enqueue(w write) {
	select {
	case r.queue <- w:
	default:
		r.results.WithLabelValues(eventDropped).Inc()
		r.mu.Lock()
		w.series.pending = false
		r.mu.Unlock()
	}
}

// Run writes the queued Events, at the node-wide rate, and every 30 s the series of the
// Events repeated since their last write, until ctx ends. What is still queued then is dropped:
// Events are best effort, and shutdown does not wait for an API server.
func (r *EventRecorder) Run(ctx context.Context) {
	flush := time.NewTicker(seriesWriteInterval)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case w := <-r.queue:
			if err := r.limiter.Wait(ctx); err != nil {
				return
			}
			r.write(ctx, w)
		case <-flush.C:
			r.flushSeries()
		}
	}
}

// flushSeries queues the series write of every Event repeated since its last write.
func (r *EventRecorder) flushSeries() {
	r.mu.Lock()
	var due []write
	for k, s := range r.series {
		if !s.pending && s.name != "" && s.count > s.written {
			s.pending = true
			due = append(due, write{series: s, key: k})
		}
	}
	r.mu.Unlock()
	for _, w := range due {
		r.enqueue(w)
	}
}

func (r *EventRecorder) write(ctx context.Context, w write) {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	if w.event != nil {
		out, err := r.sink.CreateEvent(ctx, w.event)
		r.mu.Lock()
		w.series.pending = false
		if err == nil {
			w.series.namespace, w.series.name = out.Namespace, out.Name
		}
		r.mu.Unlock()
		if err != nil {
			r.results.WithLabelValues(eventFailed).Inc()
			logger.V(2).Info("Event not written", "reason", w.event.Reason, "pod", klog.KRef(w.event.Namespace, w.event.Regarding.Name), "err", err)
			return
		}
		r.results.WithLabelValues(eventCreated).Inc()
		return
	}
	r.mu.Lock()
	s := w.series
	ns, name, count, last := s.namespace, s.name, s.count, s.last
	r.mu.Unlock()
	patch, _ := json.Marshal(map[string]any{"series": eventsv1.EventSeries{Count: count, LastObservedTime: metav1.NewMicroTime(last)}}) // plain types: cannot fail
	_, err := r.sink.PatchEvent(ctx, ns, name, patch)
	r.mu.Lock()
	s.pending = false
	if err == nil {
		s.written, s.lastWrite = count, r.now()
	}
	r.mu.Unlock()
	if err != nil {
		r.results.WithLabelValues(eventFailed).Inc()
		logger.V(2).Info("Event series not written", "event", klog.KRef(ns, name), "err", err)
		return
	}
	r.results.WithLabelValues(eventSeries).Inc()
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

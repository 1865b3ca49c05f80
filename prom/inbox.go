package prom

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/txoutbox/txoutbox/inbox"
)

// InboxMetrics exports an inbox's results to Prometheus: pass its Observe
// method as inbox.Config.Observe.
//
//	txoutbox_inbox_messages_total{consumer, result}   applied, duplicate, failed, parked, rejected
//	txoutbox_inbox_handle_seconds{consumer, result}   the duration of Handle (the handler and the transaction)
//
// received is the sum over the results. It is safe for concurrent use and
// a prometheus.Collector.
type InboxMetrics struct {
	messages *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

var _ prometheus.Collector = (*InboxMetrics)(nil)

// NewInbox returns the metrics of the inboxes of a process (the consumer
// label tells them apart), registered on reg (nil: not registered). It
// takes the options of New; the duration buckets are WithDurationBuckets'.
func NewInbox(reg prometheus.Registerer, opts ...Option) (*InboxMetrics, error) {
	o := options{namespace: DefaultNamespace, latencyBuckets: DefaultBuckets, durationBuckets: DefaultBuckets}
	for _, opt := range opts {
		opt(&o)
	}
	hopts := prometheus.HistogramOpts{Namespace: o.namespace, Name: "inbox_handle_seconds", ConstLabels: o.constLabels, Buckets: o.durationBuckets,
		Help: "Duration of inbox.Handle, the handler and its transaction included, by consumer and result."}
	if o.nativeFactor > 0 {
		hopts.NativeHistogramBucketFactor = o.nativeFactor
	}
	m := &InboxMetrics{
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: o.namespace, Name: "inbox_messages_total", ConstLabels: o.constLabels,
			Help: "Messages handled by the inbox, by consumer and result (applied, duplicate, failed, parked, rejected)."}, []string{"consumer", "result"}),
		duration: prometheus.NewHistogramVec(hopts, []string{"consumer", "result"}),
	}
	if reg != nil {
		if err := reg.Register(m); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Observe records one result; it is an inbox.Config.Observe.
func (m *InboxMetrics) Observe(o inbox.Observation) {
	r := o.Result.String()
	m.messages.WithLabelValues(o.Consumer, r).Inc()
	m.duration.WithLabelValues(o.Consumer, r).Observe(o.Duration.Seconds())
}

// Describe implements prometheus.Collector.
func (m *InboxMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.messages.Describe(ch)
	m.duration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *InboxMetrics) Collect(ch chan<- prometheus.Metric) {
	m.messages.Collect(ch)
	m.duration.Collect(ch)
}

package prom

import "github.com/prometheus/client_golang/prometheus"

// SubscriptionDeliveries returns the counter of a subscription's outcome.
func (m *Metrics) SubscriptionDeliveries(sub, outcome string) prometheus.Counter {
	return m.subCalls.WithLabelValues(sub, outcome)
}

// StatementRows returns the counter of the rows of one statement.
func (m *Metrics) StatementRows(name string) prometheus.Counter {
	return m.statementRows.WithLabelValues(name)
}

// Package outboxtest helps test code that publishes through an outbox.
package outboxtest

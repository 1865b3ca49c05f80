package oteloutbox_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	amqpoutbox "github.com/txoutbox/txoutbox/adapters/amqp"
	"github.com/txoutbox/txoutbox/internal/testbroker"
	"github.com/txoutbox/txoutbox/outbox"
)

// The same request through amqpoutbox: the RabbitMQ message's traceparent
// header carries the request's trace id.
func TestHTTPRequestToRabbitMQ(t *testing.T) {
	url := testbroker.AMQP(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	queue := "txo-otel-" + strings.ToLower(outbox.NewID())
	if _, err := ch.QueueDeclare(queue, false, true, false, false, nil); err != nil { // auto-delete
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}

	a := newApp(t, func(ob *outbox.Outbox) {
		// The default exchange routes to the queue named by the key.
		pub, err := amqpoutbox.New(amqpoutbox.Config{URL: url, RoutingKey: queue})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() }) // after ob.Close (registered later, runs first)
		if err := ob.Subscribe(outbox.Subscription{Name: "to-rabbitmq", Batch: pub.Handler()}); err != nil {
			t.Fatal(err)
		}
	})
	a.order(t)

	var d amqp.Delivery
	select {
	case d = <-deliveries:
	case <-time.After(10 * time.Second):
		t.Fatal("no message in the queue")
	}
	a.checkTrace(t, "to-rabbitmq", func(k string) string {
		v, _ := d.Headers[k].(string)
		if v == "" && d.Headers[k] != nil {
			v = fmt.Sprint(d.Headers[k])
		}
		return v
	})
}

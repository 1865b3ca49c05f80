// Package schema holds the ent schema of the adapter's tests: one Order
// entity, enough to write business rows next to outbox events.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is a customer's order.
type Order struct {
	ent.Schema
}

// Fields of the Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("customer"),
		field.Int("total").NonNegative(),
	}
}

package driver

import (
	"context"
	"time"
)

// Archiver is implemented by stores that can keep delivered events in an
// archive instead of the event table (sqlstore's
// Options.ArchiveDelivered): the write that completes an event moves it
// there, in one transaction, with when and by whom it was delivered.
type Archiver interface {
	// CleanupArchive deletes up to limit archived events delivered more
	// than olderThan ago on the database's clock (olderThan ≤ 0: all of
	// them), oldest first, and returns how many it deleted. It touches
	// nothing but the archive (and the delivery records kept with it).
	CleanupArchive(ctx context.Context, olderThan time.Duration, limit int) (int64, error)
	// SearchArchive returns up to q.Limit archived events that match q,
	// by id.
	SearchArchive(ctx context.Context, q ArchiveQuery) ([]ArchivedEvent, error)
}

// ArchiveQuery selects archived events (Archiver.SearchArchive). Each set
// field narrows the search; none set lists the whole archive.
type ArchiveQuery struct {
	// ID is one event's id.
	ID string
	// Type is an event type.
	Type string
	// AggregateType and AggregateID are an aggregate, or with
	// AggregateID empty every aggregate of the type. AggregateID needs
	// AggregateType.
	AggregateType, AggregateID string
	// After is the id of the last event of the previous page; "" for the
	// first.
	After string
	// Limit is the most events returned: 1 to 1000, 0 for 100.
	Limit int
}

// ArchivedEvent is one archived event (Archiver.SearchArchive), without
// its payload and headers: look it up by id (Inspector.Inspect) for
// those.
type ArchivedEvent struct {
	ID            string
	Type          string
	AggregateType string
	AggregateID   string
	TenantID      string
	OrderingKey   string
	// Attempts is the failed deliveries it took.
	Attempts int
	// CreatedAt is when it was written (or fell due), DeliveredAt when it
	// was delivered, both on the database's clock.
	CreatedAt, DeliveredAt time.Time
	// DeliveredBy is the instance that completed it (Config.InstanceID).
	DeliveredBy string
}

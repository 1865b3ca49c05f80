package outbox

import "github.com/txoutbox/txoutbox/outbox/driver"

// The names below are defined by package driver, the store contract, and
// are part of the user API too: what a transaction must offer, what
// operators read back. Store implementers use package driver; users need
// only these aliases.
type (
	// DBTx is an open transaction on the outbox's database, as a
	// TxHandler gets it; *sql.Tx satisfies it.
	DBTx = driver.DBTx
	// Record is everything the store knows of one event (Outbox.Inspect).
	Record = driver.Record
	// DeliveryRecord is one subscription's delivery state of an event.
	DeliveryRecord = driver.DeliveryRecord
	// Attempt is one failed delivery attempt kept in a delivery's history.
	Attempt = driver.Attempt
	// Stats counts the events by status (Outbox.Stats, Metrics.Backlog).
	Stats = driver.Stats
	// Lag is what one subscription has not yet delivered (Outbox.Lag).
	Lag = driver.Lag
	// DeadLetter is one dead delivery (Outbox.Dead).
	DeadLetter = driver.DeadLetter
	// DeadFilter selects dead deliveries (Outbox.Dead, Outbox.Replay).
	DeadFilter = driver.DeadFilter
	// Status is the state of an event or of one delivery (Record.Status).
	Status = driver.Status
	// ScheduledEvent is an event not due yet (Outbox.Scheduled).
	ScheduledEvent = driver.ScheduledEvent
	// ArchiveQuery selects archived events (Outbox.SearchArchive).
	ArchiveQuery = driver.ArchiveQuery
	// ArchivedEvent is one delivered event kept in the archive
	// (Outbox.SearchArchive).
	ArchivedEvent = driver.ArchivedEvent
)

// The statuses of an event and of a delivery.
const (
	StatusNew   = driver.StatusNew
	StatusDone  = driver.StatusDone
	StatusRetry = driver.StatusRetry
	StatusDead  = driver.StatusDead
	StatusSplit = driver.StatusSplit
)

// ErrNotFound is returned by Inspect and Cancel for an id the store does
// not hold.
var ErrNotFound = driver.ErrNotFound

// ErrOrderedNotCancellable is returned by Cancel for an ordered event.
var ErrOrderedNotCancellable = driver.ErrOrderedNotCancellable

// Package driver is the contract between the outbox engine and a store:
// what a database (or a test double) implements so that the engine can
// write, claim, complete and inspect events and their per-subscription
// deliveries. Users of the outbox do not need it: they pass a store (e.g.
// sqlstore.New) to outbox.New and use the outbox package's API. Store
// implementers start with Store and DeliveryStore; the conformance suite
// in outbox/storetest tells whether an implementation keeps the contract.
//
// The names here that users also see (Record, Stats, Lag, DeadLetter,
// DeadFilter, Attempt, DBTx) are re-exported by package outbox as
// aliases.
//
// # Hints
//
// A few fields and results are the engine's hints, for speed only; a
// store may ignore every one of them and stays correct: Row.KeyAfter (a
// store that ignores it leases a key's head only), ClaimRequest.Run (it
// claims heads only), KeysDone (a no-op), and MarkDoneKeys' later keys
// (it may report every key). The conformance suite runs the engine on a
// store that ignores them all (storetest.Harness.IgnoresHints).
package driver

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"time"
)

// Execer runs a statement. *sql.DB, *sql.Tx, *sql.Conn, *sqlx.Tx, GORM's
// ConnPool and an ent transaction built with the sql/execquery feature all
// satisfy it.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// DBTx is an open transaction on the outbox's database, as a transactional
// handler gets it; *sql.Tx satisfies it.
type DBTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Status is the delivery state of a stored event.
type Status int8

// The stored status codes. They are part of the table's format and never
// change.
const (
	StatusNew   Status = 0 // written, not yet delivered
	StatusDone  Status = 1 // every listener succeeded
	StatusRetry Status = 2 // a listener failed; due again at available_at
	StatusDead  Status = 3 // given up: max attempts, a permanent error, or undecodable
)

func (s Status) String() string {
	switch s {
	case StatusNew:
		return "new"
	case StatusDone:
		return "done"
	case StatusRetry:
		return "retry"
	case StatusDead:
		return "dead"
	}
	return "status(" + strconv.Itoa(int(s)) + ")"
}

// Row is an event as a Store writes and reads it. The payload and headers
// are already encoded: stores copy bytes, they never interpret them.
type Row struct {
	ID            string
	Type          string
	AggregateType string
	AggregateID   string
	TenantID      string
	Headers       []byte // a JSON object of strings, or nil
	Payload       []byte
	PayloadJSON   bool
	OccurredAt    time.Time
	// OrderingKey is the event's ordering key, or "". An event with a
	// KeySeq is delivered in order of its key (OrderedStore); one without
	// keeps its key for handlers only.
	OrderingKey string
	// KeySeq is the event's number in its key's sequence, assigned by
	// OrderedStore.InsertOrdered; 0 for an event not delivered in order.
	KeySeq int64
	// KeyAfter is set by the caller of OrderedStore.InsertOrdered, never
	// stored: the number of an event of the key that the owner holds or
	// has just delivered (0: none). An event numbered KeyAfter+1 is
	// written leased to the owner even when it is not the key's head,
	// for the owner to deliver once the event before it is delivered.
	KeyAfter int64

	// Set by Claim.
	Status    Status
	Attempts  int       // failed deliveries so far
	CreatedAt time.Time // database time of the insert
	// PrevOwner is the owner whose lease had expired when Claim took the
	// row, or "" if the row was free or already this owner's.
	PrevOwner string
	// Behind is set by OrderedStore.ClaimHeads: the ordered subscriptions
	// that still owe an earlier event of the row's key (one pending or,
	// for a blocking subscription, dead for them). The engine must not
	// deliver the row to them now: it records a NEW delivery for each
	// (DeliveryStore.Split), which ClaimDeliveries leases once they
	// delivered the events before it. Nil for the others.
	Behind []string
	// ReadError is set by Claim (and Inspect) when some of the row's
	// stored columns cannot be read: a zero or infinite date, text in a
	// time column, a flag that is neither 0 nor 1. It names each column and
	// why, never the payload. The engine marks such a row DEAD with this
	// text instead of failing the claim, so one damaged row never stops
	// the others; the fields it names hold zero values.
	ReadError error
}

// ClaimRequest says which due rows Claim may take and for how long.
type ClaimRequest struct {
	// Owner identifies the claiming instance; it becomes the rows' owner.
	Owner string
	// Limit is the most rows to claim.
	Limit int
	// Lease is how long the claim holds, counted on the database's clock.
	Lease time.Duration
	// SkipRecent keeps Claim off rows written less than this long ago.
	SkipRecent time.Duration
	// Run is, for OrderedStore.ClaimHeads and DeliveryStore's
	// ClaimDeliveries, how many events in all the claim may lease behind
	// the heads it leases, shared evenly among them (0: the heads only; see
	// ClaimHeads). Limit bounds the heads; the runs come on top.
	Run int
	// Types, if not nil, limits Claim to events of these types: the
	// instance's subscriptions take these, and a subscription elsewhere
	// takes every other type. NotTypes keeps Claim off events of these
	// types: other instances' subscriptions take them, none of the
	// claiming instance's does. At most one of the two is set (the engine
	// sets neither when one of its subscriptions takes every type). An
	// instance thus never claims an event it could only hand back.
	Types, NotTypes []string
}

// TypeAllowed reports whether req's Types and NotTypes let Claim take an
// event of type t.
func (req *ClaimRequest) TypeAllowed(t string) bool {
	if req.Types != nil {
		return slices.Contains(req.Types, t)
	}
	return !slices.Contains(req.NotTypes, t)
}

// Store persists events. The engine calls Insert inside the caller's
// transaction and everything else on its own short transactions.
// Implementations must be safe for concurrent use.
//
// Every write that follows a claim (MarkDone, MarkRetry, MarkDead,
// ExtendLeases, Release) must change a row only while owner still holds it,
// so that an instance whose lease expired cannot overwrite the work of the
// instance that took the row over. Times (due times, leases) are taken from
// the database's clock, never from the caller's.
//
// Who retries what: a store retries the transient errors it can
// recognise (deadlocks, lock-wait timeouts, a busy database) itself, a few
// times with a short jittered back-off, before it returns (sqlstore: up to
// 6 attempts over about 150 ms). The engine retries each of its own writes
// that failed anyway (completion, retry and dead marks, splits,
// deliveries) up to 4 times over about 175 ms, within a 15 s deadline per
// write; a write that still fails is logged, and the row's lease makes it
// due again later, so nothing is lost (the event may be delivered once
// more). A sqlstore write can thus run up to 24 statements. Insert is
// never retried: it runs in the caller's transaction, whose fate the
// caller decides. Claim is retried by the store only; a failed poll is
// repeated at the next poll.
//
// The package outbox/sqlstore implements Store for MySQL/MariaDB,
// PostgreSQL and SQLite; outbox/outboxtest has an in-memory one;
// outbox/storetest checks an implementation.
type Store interface {
	// Insert writes row with status NEW through exec, the caller's open
	// transaction, owned by owner with a lease of lease from now; with an
	// empty owner the row is free for any instance at once.
	Insert(ctx context.Context, exec Execer, row *Row, owner string, lease time.Duration) error

	// Claim takes up to req.Limit rows that are NEW or RETRY, have no
	// KeySeq (ordered rows are claimed with OrderedStore.ClaimHeads), due, older
	// than req.SkipRecent, of a type req allows (TypeAllowed), and not held
	// by a live lease (not even one of req.Owner's), and leases them to
	// req.Owner. Two concurrent Claims
	// never return the same row. A row some of whose columns cannot be
	// read is returned with Row.ReadError set, never as an error of the
	// whole claim. If Claim returns an error, it has leased nothing to
	// req.Owner (a commit whose outcome is unknown is undone with Release).
	Claim(ctx context.Context, req ClaimRequest) ([]Row, error)

	// MarkDone sets the rows owner holds among ids to DONE and returns how
	// many changed, provided the registry's version is still registry (the
	// Registration.Version by which the engine decided that the events
	// owe nothing to any other subscription). If it is not, MarkDone
	// changes nothing and returns an error wrapping ErrRegistryChanged: a
	// subscription may have been registered since that the events are
	// owed to. The version must be read by the write itself (in its
	// statement or transaction), never from an earlier read: an event
	// committed after a registration committed was delivered, and so
	// completed, by a call that starts after it, whose read (a statement
	// snapshot at READ COMMITTED, or SQLite's serialised writes) sees the
	// new version.
	MarkDone(ctx context.Context, owner string, ids []string, registry int64) (int, error)

	// MarkRetry counts a failed attempt, stores errText and makes the row
	// due again after delay, releasing the lease. It reports whether owner
	// still held the row. The engine passes an errText that every database
	// can store: valid UTF-8, no NUL, at most MaxErrorChars characters.
	MarkRetry(ctx context.Context, owner, id string, delay time.Duration, errText string) (bool, error)

	// MarkDead counts a failed attempt, stores errText and sets the row to
	// DEAD. It reports whether owner still held the row.
	MarkDead(ctx context.Context, owner, id string, errText string) (bool, error)

	// ExtendLeases renews owner's lease on ids to lease from now and returns
	// how many rows owner still held.
	ExtendLeases(ctx context.Context, owner string, ids []string, lease time.Duration) (int, error)

	// Release gives up owner's lease on ids without counting an attempt:
	// they are due again for any instance at once (delay 0) or after
	// delay. Rows owner does not hold are left alone.
	Release(ctx context.Context, owner string, ids []string, delay time.Duration) error
}

// ErrRegistryChanged is returned (wrapped) by the writes that complete
// events for a set of subscriptions (Store.MarkDone,
// OrderedStore.MarkDoneKeys, DeliveryStore.Split) when the subscription
// registry's version is no longer the one the caller decided that set by.
// The write changed nothing; the caller learns the registry again
// (DeliveryStore.SyncSubscriptions) and delivers the events anew.
var ErrRegistryChanged = errors.New("outbox: the subscription registry changed (a subscription was registered since): completion not written; sync the subscriptions and deliver again")

// ErrNotFound is returned by Inspector.Inspect for an id with no row.
var ErrNotFound = errors.New("outbox: event not found")

// Record is a stored event with its delivery state.
type Record struct {
	Row
	// Owner is the instance holding the row's lease, or "".
	Owner string
	// LastError is the error of the last failed attempt, or "".
	LastError string
	// Deliveries is the state of each subscription that did not deliver
	// the event at the first try (Status is then StatusSplit), in
	// subscription name order.
	Deliveries []DeliveryRecord
	// DeliveredAt (on the database's clock) and DeliveredBy (the
	// instance) are set when the event was found in the store's archive
	// (Archiver): delivered and moved out of the event table.
	DeliveredAt time.Time
	DeliveredBy string
}

// Archived reports whether the record is of an archived event.
func (r Record) Archived() bool { return !r.DeliveredAt.IsZero() }

// DeliveryRecord is the stored state of one subscription's delivery of an
// event.
type DeliveryRecord struct {
	Subscription string
	Status       Status
	Attempts     int
	Owner        string
	LastError    string
	// History is the last failed attempts, newest first (at most
	// MaxHistory).
	History []Attempt
}

// MaxHistory is the most failed attempts Inspect returns per delivery.
const MaxHistory = 10

// Attempt is one failed delivery attempt as recorded.
type Attempt struct {
	// N is the attempt's number (1 for the first).
	N int
	// At is when it was recorded, on the database's clock.
	At time.Time
	// Error is its error text.
	Error string
}

// Inspector is implemented by stores that can look up one event by id, for
// tools and tests. Inspect returns ErrNotFound for an unknown id.
type Inspector interface {
	Inspect(ctx context.Context, id string) (Record, error)
}

// Stats are the counts of a Store's table by status, and the age of the
// oldest undelivered event.
type Stats struct {
	// New, Retry, Done and Dead count the events by status. Dead counts
	// the events dead as a whole only: see DeadDeliveries and DeadLetters.
	New, Retry, Done, Dead int64
	// DeadDeliveries counts the dead deliveries of split events: one per
	// (event, subscription) that gave up while the event's other
	// subscriptions delivered it. The event itself is counted in Split.
	DeadDeliveries int64
	// Split counts events whose delivery state is kept per subscription
	// (some subscriptions owe them still, or gave up): see DeliveryStore.
	Split int64
	// Unknown counts rows whose status is none of the above (written by
	// hand or by a newer version): the engine never claims them, and
	// reports them when it samples the table.
	Unknown int64
	// OldestPending is the age of the oldest NEW or RETRY row on the
	// database's clock, or 0 if there is none.
	OldestPending time.Duration
}

// Pending returns the number of events not yet delivered.
func (s Stats) Pending() int64 { return s.New + s.Retry }

// DeadLetters returns the number of dead letters, as Outbox.Dead lists
// them: the events dead as a whole and the dead deliveries of split
// events. This is the number to show as "dead".
func (s Stats) DeadLetters() int64 { return s.Dead + s.DeadDeliveries }

// StatsReader is implemented by stores that can count their rows. The
// engine samples it every Config.StatsInterval for Metrics.Backlog.
type StatsReader interface {
	Stats(ctx context.Context) (Stats, error)
}

// DeadLetter is a row in status DEAD, as listed for operators. It has no
// payload: listings are not the place for personal data.
type DeadLetter struct {
	ID string
	// Subscription is the subscription that gave up, or "" when the event
	// as a whole is dead (it could not be read, or it failed before it
	// was split per subscription).
	Subscription  string
	Type          string
	AggregateType string
	AggregateID   string
	TenantID      string
	Attempts      int
	LastError     string
	CreatedAt     time.Time
}

// DeadLetterStore is implemented by stores that can list and replay dead
// letters.
type DeadLetterStore interface {
	// ListDead returns up to limit dead letters (DEAD events and the dead
	// deliveries of split events) with ids greater than after, in id
	// order; the dead deliveries of one event are never split across two
	// pages.
	ListDead(ctx context.Context, after string, limit int) ([]DeadLetter, error)
	// Replay makes the given DEAD rows, and the dead deliveries of the
	// given events, due again at once with zero attempts, and returns how
	// many it changed. A delivery that succeeded is not run again.
	Replay(ctx context.Context, ids []string) (int, error)
}

// Scheduler is implemented by stores that can delay an event
// (Envelope.NotBefore).
type Scheduler interface {
	// Schedule makes event id, inserted free (no owner) through exec, the
	// caller's transaction, due delay after the database's current time,
	// and not before: no Claim, ClaimHeads or DueKeys takes it until
	// then, and an ordered one holds back the later events of its key
	// meanwhile, as any head not due does. Its CreatedAt becomes that
	// time too: the age of a pending event (Stats.OldestPending) counts
	// from when it is due.
	Schedule(ctx context.Context, exec Execer, id string, delay time.Duration) error
	// Scheduled returns up to limit NEW events that are not due yet and
	// not leased, earliest due first (then by id), those due after
	// (dueAfter, idAfter) when idAfter is set: the events Schedule
	// delayed, and events given back for a while (no subscription took
	// them).
	Scheduled(ctx context.Context, dueAfter time.Time, idAfter string, limit int) ([]ScheduledEvent, error)
	// Cancel marks event id DONE if it is NEW, not due yet, not leased and
	// not ordered (an ordered event's key waits behind it: it cannot be
	// taken out of the key's sequence); it reports whether it did.
	// ErrNotFound for an unknown id; ErrOrderedNotCancellable for an
	// ordered event.
	Cancel(ctx context.Context, id string) (bool, error)
	// NextDue returns how long until the earliest of the events Scheduled
	// lists falls due, on the database's clock, and false if there is
	// none. An engine that knows of more due times than it keeps in
	// memory asks it after each poll, to wake on time for the rest.
	NextDue(ctx context.Context) (time.Duration, bool, error)
}

// ScheduledEvent is an event not due yet (Scheduler.Scheduled).
type ScheduledEvent struct {
	ID            string
	Type          string
	AggregateType string
	AggregateID   string
	OrderingKey   string
	// Due is when it falls due, on the database's clock.
	Due time.Time
}

// ErrOrderedNotCancellable is returned by Scheduler.Cancel for an
// ordered event.
var ErrOrderedNotCancellable = errors.New("outbox: an ordered event cannot be cancelled: the later events of its key wait behind it (publish a compensating event instead)")

// OnceInserter is implemented by stores that can write an event only if
// no event with its id exists (Outbox.PublishOnce).
type OnceInserter interface {
	// InsertOnce runs insert, the engine's writes of the event id through
	// exec, the caller's transaction (Insert, or
	// OrderedStore.InsertOrdered), so that if an event with that id
	// exists (committed before, or by a concurrent transaction that
	// commits meanwhile) it returns ErrDuplicateID with nothing insert
	// wrote left and exec's transaction still usable. Another error of
	// insert is returned as it is, with nothing left of it either.
	InsertOnce(ctx context.Context, exec Execer, id string, insert func() error) error
}

// ErrDuplicateID is returned by OnceInserter.InsertOnce when an event
// with the id exists.
var ErrDuplicateID = errors.New("outbox: an event with this id exists")

// BatchInserter is implemented by stores that write several rows in one
// statement. PublishAll uses it; without it, it inserts row by row.
type BatchInserter interface {
	// InsertBatch is Insert for rows, in order, all or none (it runs in
	// the caller's transaction).
	InsertBatch(ctx context.Context, exec Execer, rows []Row, owner string, lease time.Duration) error
}

// OwnerReleaser is implemented by stores that can give up every lease
// one owner holds in one call. outbox.Outbox.Close calls it last, once
// every part of the engine has stopped: whatever Close cut short on the
// way (a hand-back, a claim that answered after its grace period, a DONE
// never written), nothing stays leased to the closed instance until its
// lease runs out.
type OwnerReleaser interface {
	// ReleaseOwner gives up owner's leases on every NEW or RETRY event
	// and delivery it holds, as Release and ReleaseDeliveries with delay
	// 0 do, and returns how many it released. It must not wait for rows
	// that other transactions hold (an application's insert not yet
	// committed, another instance's claim): rows committed leased to
	// owner after it read them are left as they are.
	ReleaseOwner(ctx context.Context, owner string) (int, error)
}

// Cleaner is implemented by stores that can delete delivered rows.
type Cleaner interface {
	// Cleanup deletes up to limit DONE rows (and DEAD rows too if
	// includeDead) last due more than olderThan ago on the database's
	// clock (olderThan ≤ 0: all of them), and returns how many it deleted.
	// It never deletes NEW or RETRY rows.
	Cleanup(ctx context.Context, olderThan time.Duration, limit int, includeDead bool) (int64, error)
}

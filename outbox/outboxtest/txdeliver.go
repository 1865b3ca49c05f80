package outboxtest

import (
	"context"
	"database/sql"
	"slices"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

var _ driver.TxDeliveryStore = (*Store)(nil)

// TxEffect is a statement a transactional handler (Subscription.Tx) ran
// through its transaction, as the Store kept it once the transaction
// committed.
type TxEffect struct {
	EventID      string
	Subscription string
	Query        string
	Args         []any
}

// effectTx is the transaction a Tx handler gets from the Store: it keeps
// the statements run through ExecContext and commits them with the
// delivery's DONE, or drops them.
type effectTx struct {
	eventID, sub string
	staged       []TxEffect
}

type effectResult struct{}

func (effectResult) LastInsertId() (int64, error) { return 0, ErrNoSQL }
func (effectResult) RowsAffected() (int64, error) { return 1, nil }

// ExecContext keeps the statement; it takes effect if the delivery
// commits.
func (t *effectTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	t.staged = append(t.staged, TxEffect{EventID: t.eventID, Subscription: t.sub, Query: query, Args: slices.Clone(args)})
	return effectResult{}, nil
}

// QueryContext returns ErrNoSQL: there is no database to read.
func (t *effectTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return nil, ErrNoSQL
}

// QueryRowContext returns nil: there is no database to read. A Tx handler
// tested on this store must not read through its transaction.
func (t *effectTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return nil
}

// DeliverInTx implements driver.TxDeliveryStore: f runs with a
// transaction whose ExecContext keeps each statement (see TxEffects), and
// the statements are kept together with the delivery's DONE, once. If the
// delivery was recorded already, f's statements are dropped and already
// is true. QueryContext and QueryRowContext of the transaction do not
// work: there is no SQL. A call whose turn is over (see the driver's
// contract) records nothing and returns driver.ErrLeaseLost.
func (s *Store) DeliverInTx(ctx context.Context, owner string, at driver.TxTurn, eventID, sub string, f func(tx driver.DBTx) error) (already bool, err error) {
	s.mu.Lock()
	done, err := s.txTurn(owner, at, eventID, sub)
	s.mu.Unlock()
	if done || err != nil {
		return done, err
	}
	tx := &effectTx{eventID: eventID, sub: sub}
	if err := f(tx); err != nil {
		return false, err
	}
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if done, err := s.txTurn(owner, at, eventID, sub); done || err != nil {
		return done, err
	}
	ds := s.deliv[eventID]
	if ds == nil {
		ds = map[string]*memDelivery{}
		s.deliv[eventID] = ds
	}
	d := ds[sub]
	if d == nil {
		s.seq++
		d = &memDelivery{createdAt: now, availableAt: now, seq: s.seq}
		ds[sub] = d
	}
	d.status, d.doneAt, d.owner, d.lockedUntil = outbox.StatusDone, now, "", time.Time{}
	s.completeSplit(eventID, now)
	s.effects = append(s.effects, tx.staged...)
	s.touch()
	return false, nil
}

// txTurn reports whether the delivery of eventID to sub is recorded DONE,
// or driver.ErrLeaseLost if owner's turn at with it is over. The caller
// holds s.mu.
func (s *Store) txTurn(owner string, at driver.TxTurn, eventID, sub string) (done bool, err error) {
	d := s.deliv[eventID][sub]
	switch {
	case d != nil && d.status == outbox.StatusDone:
		return true, nil
	case at.Whole && d != nil,
		!at.Whole && (d == nil || d.owner != owner || d.attempts != at.Attempts || (d.status != outbox.StatusNew && d.status != outbox.StatusRetry)):
		return false, driver.ErrLeaseLost
	}
	return false, nil
}

// deliveredTo reports whether the delivery of eventID to sub is recorded
// DONE. The caller holds s.mu.
func (s *Store) deliveredTo(eventID, sub string) bool {
	d := s.deliv[eventID][sub]
	return d != nil && d.status == outbox.StatusDone
}

// TxEffects returns the statements that transactional handlers ran and
// that committed with their delivery, in commit order.
func (s *Store) TxEffects() []TxEffect {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.effects)
}

// Leased returns the events and deliveries (as "event id/subscription")
// that owner holds under a lease that has not run out.
func (s *Store) Leased(owner string) []string {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id, e := range s.events {
		if e.owner == owner && !free(e.lockedUntil, now) && undone(e.row.Status) {
			out = append(out, id)
		}
	}
	for id, ds := range s.deliv {
		for sub, d := range ds {
			if d.owner == owner && !free(d.lockedUntil, now) && undone(d.status) {
				out = append(out, id+"/"+sub)
			}
		}
	}
	slices.Sort(out)
	return out
}

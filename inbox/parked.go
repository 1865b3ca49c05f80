package inbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Entry is a parked message: a dead inbox entry.
type Entry struct {
	Consumer   string
	Message    Message
	ReceivedAt time.Time // when it was parked
	Attempts   int
	LastError  string
}

// ParkedFilter selects parked messages for Parked.
type ParkedFilter struct {
	// Consumer, if set, lists only this consumer's messages.
	Consumer string
	// AfterConsumer and AfterID continue a listing after the last entry
	// of the previous page (AfterConsumer is ignored with Consumer set).
	AfterConsumer, AfterID string
	// Limit is the largest number of entries returned. Defaults to 100.
	Limit int
}

// Parked lists parked messages in (consumer, message id) order.
func (ib *Inbox) Parked(ctx context.Context, f ParkedFilter) ([]Entry, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = 100
	}
	var rows *sql.Rows
	var err error
	if f.Consumer != "" {
		rows, err = ib.db.QueryContext(ctx, ib.q.listAfter, f.Consumer, f.AfterID, limit)
	} else {
		rows, err = ib.db.QueryContext(ctx, ib.q.listAll, f.AfterConsumer, f.AfterConsumer, f.AfterID, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("inbox: list parked messages: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		e, err := ib.scanEntry(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

type scanner interface{ Scan(dest ...any) error }

func (ib *Inbox) scanEntry(s scanner) (Entry, error) {
	var e Entry
	var at any
	var headers sql.NullString
	if err := s.Scan(&e.Consumer, &e.Message.ID, &at, &e.Attempts, &e.LastError, &headers, &e.Message.Payload); err != nil {
		return Entry{}, err
	}
	var err error
	if e.ReceivedAt, err = ib.d.scanTime(at); err != nil {
		return Entry{}, err
	}
	if headers.Valid && headers.String != "" {
		if err := json.Unmarshal([]byte(headers.String), &e.Message.Headers); err != nil {
			return Entry{}, fmt.Errorf("inbox: headers of parked message %q: %w", e.Message.ID, err)
		}
	}
	return e, nil
}

// Entry returns one parked message; ErrNotParked if there is none.
func (ib *Inbox) Entry(ctx context.Context, consumer, id string) (Entry, error) {
	e, err := ib.scanEntry(ib.db.QueryRowContext(ctx, ib.q.entry, consumer, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Entry{}, fmt.Errorf("%w (consumer %q, id %q)", ErrNotParked, consumer, id)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("inbox: read the parked message: %w", err)
	}
	return e, nil
}

// Replay applies a parked message with h, like Handle: in one transaction
// the row becomes applied and h runs. If h fails, the message stays
// parked with h's error as its last error, and Replay returns Parked and
// the error. A message that is not parked gives ErrNotParked.
func (ib *Inbox) Replay(ctx context.Context, consumer, id string, h Handler) (Result, error) {
	start := time.Now()
	res, err := ib.replay(ctx, consumer, id, h)
	ib.observe(consumer, id, res, start, err)
	return res, err
}

func (ib *Inbox) replay(ctx context.Context, consumer, id string, h Handler) (Result, error) {
	if h == nil {
		panic("inbox: Replay: handler is nil")
	}
	e, err := ib.Entry(ctx, consumer, id)
	if err != nil {
		return Failed, err
	}
	unit, err := ib.begin(ctx, &sql.TxOptions{})
	if err != nil {
		return Failed, fmt.Errorf("inbox: begin transaction: %w", err)
	}
	tctx := txctx.With(ctx, unit)
	n, err := execRows(tctx, unit, ib.q.unpark, consumer, id)
	if err != nil || n == 0 {
		if err == nil {
			err = fmt.Errorf("%w (consumer %q, id %q: replayed or purged meanwhile)", ErrNotParked, consumer, id)
		}
		return Failed, errors.Join(err, rollback(unit))
	}
	if herr := call(tctx, h, e.Message); herr != nil {
		err := errors.Join(herr, rollback(unit))
		if _, uerr := ib.db.ExecContext(context.WithoutCancel(ctx), ib.q.reparkError, errorText(herr), consumer, id); uerr != nil {
			err = errors.Join(err, fmt.Errorf("inbox: record the error: %w", uerr))
		}
		return Parked, err
	}
	if err := unit.Commit(); err != nil {
		return Failed, fmt.Errorf("inbox: commit: %w", err)
	}
	return Applied, nil
}

// Purge discards parked messages of consumer: their payload and headers
// go, and their rows turn into ordinary dedupe rows that Cleanup removes
// after Config.Retention (so a late redelivery is still a Duplicate). It
// returns the number of messages purged; ids that are not parked are
// skipped.
func (ib *Inbox) Purge(ctx context.Context, consumer string, ids ...string) (int64, error) {
	var total int64
	for _, id := range ids {
		n, err := execRows(ctx, ib.db, ib.q.purge, consumer, id)
		if err != nil {
			return total, fmt.Errorf("inbox: purge %q: %w", id, err)
		}
		total += n
	}
	return total, nil
}

func encodeHeaders(h map[string]string) (any, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("inbox: encode headers: %w", err)
	}
	return string(b), nil
}

package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/outbox/driver"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox/txctx"
)

// Handle applies m for consumer once: it runs h in a transaction together
// with the insert of the inbox row (consumer, m.ID), and commits both.
//
//   - A message whose row exists (applied, parked or purged before) is
//     Duplicate: h is not called and nothing is written.
//   - If h returns an error or panics, everything rolls back (its writes,
//     its outbox events, the inbox row); the attempt is counted in a
//     transaction of its own, and the result is Failed with h's error, or
//     Parked with it once the message failed Config.MaxAttempts times.
//   - A message without an id or with a payload over Config.MaxPayload is
//     Rejected (ErrNoID, ErrTooLarge).
//
// The caller acks the broker only after Handle returns a Result whose
// Settled is true: the commit is then done. Errors that are not h's
// (begin, commit) give Failed and are not counted as attempts, nor is an
// error of h once ctx has ended (a shutdown).
func (ib *Inbox) Handle(ctx context.Context, consumer string, m Message, h Handler) (Result, error) {
	start := time.Now()
	res, err := ib.handle(ctx, consumer, m, h)
	ib.observe(consumer, m.ID, res, start, err)
	return res, err
}

func (ib *Inbox) observe(consumer, id string, res Result, start time.Time, err error) {
	if ib.cfg.Observe != nil {
		ib.cfg.Observe(Observation{Consumer: consumer, MessageID: id, Result: res, Duration: time.Since(start), Err: err})
	}
}

func (ib *Inbox) handle(ctx context.Context, consumer string, m Message, h Handler) (Result, error) {
	if h == nil {
		panic("inbox: Handle: handler is nil")
	}
	if err := ib.check(consumer, m); err != nil {
		return Rejected, err
	}
	unit, err := ib.begin(ctx, &sql.TxOptions{})
	if err != nil {
		return Failed, fmt.Errorf("inbox: begin transaction: %w", err)
	}
	tctx := txctx.With(ctx, unit)
	n, err := execRows(tctx, unit, ib.q.claim, consumer, m.ID)
	if err != nil {
		return Failed, errors.Join(fmt.Errorf("inbox: insert the inbox row: %w", err), rollback(unit))
	}
	if n == 0 {
		return Duplicate, rollback(unit)
	}
	if herr := call(tctx, h, m); herr != nil {
		if rerr := rollback(unit); rerr != nil {
			herr = errors.Join(herr, rerr)
		}
		return ib.failed(ctx, consumer, m, herr)
	}
	if err := unit.Commit(); err != nil {
		return Failed, fmt.Errorf("inbox: commit: %w", err)
	}
	return Applied, nil
}

// check refuses what cannot be stored or keyed.
func (ib *Inbox) check(consumer string, m Message) error {
	if err := checkKey("consumer name", consumer, 100); err != nil {
		return err
	}
	if m.ID == "" {
		return ErrNoID
	}
	if err := checkKey("message id", m.ID, 255); err != nil {
		return err
	}
	if len(m.Payload) > ib.cfg.MaxPayload {
		return fmt.Errorf("%w: %d bytes, the limit is %d; raise the limit, or keep large payloads out of the message", ErrTooLarge, len(m.Payload), ib.cfg.MaxPayload)
	}
	return nil
}

func checkKey(what, s string, maxLen int) error {
	switch {
	case s == "":
		return fmt.Errorf("inbox: the %s is empty", what)
	case len(s) > maxLen:
		return fmt.Errorf("inbox: the %s is %d bytes, more than %d: shorten it, or hash it with inbox.DeriveID", what, len(s), maxLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("inbox: the %s %q is not valid UTF-8: hash it with inbox.DeriveID", what, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return fmt.Errorf("inbox: the %s %q contains a NUL byte: hash it with inbox.DeriveID", what, s)
		}
	}
	return nil
}

// call runs h, turning a panic into a *PanicError.
func call(ctx context.Context, h Handler, m Message) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v}
		}
	}()
	return h(ctx, m)
}

func execRows(ctx context.Context, ex driver.Execer, q string, args ...any) (int64, error) {
	res, err := ex.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func rollback(unit middleware.Unit) error {
	if err := unit.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return fmt.Errorf("inbox: roll back: %w", err)
	}
	return nil
}

// failed counts a failed attempt of m and parks it at MaxAttempts.
func (ib *Inbox) failed(ctx context.Context, consumer string, m Message, herr error) (Result, error) {
	if ctx.Err() != nil {
		return Failed, herr // a shutdown, not the message's fault
	}
	wctx := context.WithoutCancel(ctx)
	msg := errorText(herr)
	n, err := ib.countFailure(wctx, consumer, m.ID, msg)
	if err != nil {
		ib.log.LogAttrs(ctx, slog.LevelError, "inbox: could not count a failed attempt", slog.String("consumer", consumer), slog.String("message_id", m.ID), slog.Any("error", err))
		return Failed, errors.Join(herr, fmt.Errorf("inbox: count the failed attempt: %w", err))
	}
	if n < ib.cfg.MaxAttempts {
		return Failed, herr
	}
	parked, err := ib.park(wctx, consumer, m, n, msg)
	if err != nil {
		return Failed, errors.Join(herr, fmt.Errorf("inbox: park the message: %w", err))
	}
	if !parked {
		return Duplicate, nil // another delivery applied it meanwhile
	}
	ib.log.LogAttrs(ctx, slog.LevelWarn, "inbox: message parked", slog.String("consumer", consumer), slog.String("message_id", m.ID),
		slog.Int("attempts", n), slog.String("error", msg))
	return Parked, herr
}

// maxErrorText bounds a stored error message.
const maxErrorText = 8 << 10

func errorText(err error) string {
	s := err.Error()
	if len(s) > maxErrorText {
		s = s[:maxErrorText]
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}

func (ib *Inbox) countFailure(ctx context.Context, consumer, id, msg string) (n int, err error) {
	err = ib.inTx(ctx, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, ib.q.countFailure, consumer, id, msg, msg); err != nil {
			return err
		}
		return tx.QueryRowContext(ctx, ib.q.readFailures, consumer, id).Scan(&n)
	})
	return n, err
}

func (ib *Inbox) park(ctx context.Context, consumer string, m Message, attempts int, msg string) (parked bool, err error) {
	headers, err := encodeHeaders(m.Headers)
	if err != nil {
		return false, err
	}
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	err = ib.inTx(ctx, func(tx *sql.Tx) error {
		n, err := execRows(ctx, tx, ib.q.park, consumer, m.ID, attempts, msg, headers, payload)
		if err != nil {
			return err
		}
		parked = n == 1
		_, err = tx.ExecContext(ctx, ib.q.dropFailures, consumer, m.ID)
		return err
	})
	return parked, err
}

// inTx runs f in a short transaction on the inbox's db.
func (ib *Inbox) inTx(ctx context.Context, f func(tx *sql.Tx) error) error {
	tx, err := ib.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		return errors.Join(err, rollbackSQL(tx))
	}
	return tx.Commit()
}

func rollbackSQL(tx *sql.Tx) error {
	if err := tx.Rollback(); err != nil && !errors.Is(err, sql.ErrTxDone) {
		return err
	}
	return nil
}

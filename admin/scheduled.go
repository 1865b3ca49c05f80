package admin

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// ScheduledEvent is an event not due yet (Envelope.NotBefore), as the API
// shows it (outbox.ScheduledEvent).
type ScheduledEvent struct {
	ID            string    `json:"id"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	OrderingKey   string    `json:"ordering_key,omitempty"`
	Due           time.Time `json:"due"`
}

// scheduled returns a page of the events not due yet after the cursor
// after ("" for the first page; else "due~id" as next gave it), and the
// cursor of the next page ("" on the last one).
func (h *handler) scheduled(r *http.Request, after string, limit int) ([]ScheduledEvent, string, error) {
	var from outbox.ScheduledEvent
	if after != "" {
		due, id, ok := strings.Cut(after, "~")
		t, err := time.Parse(time.RFC3339Nano, due)
		if !ok || err != nil || id == "" {
			return nil, "", fmt.Errorf("after %q: want the next link's value (due time~id)", after)
		}
		from = outbox.ScheduledEvent{ID: id, Due: t}
	}
	es, err := h.ob.Scheduled(r.Context(), from, limit)
	if err != nil {
		return nil, "", err
	}
	v := []ScheduledEvent{}
	for _, e := range es {
		v = append(v, ScheduledEvent{ID: e.ID, Type: e.Type, AggregateType: e.AggregateType, AggregateID: e.AggregateID, OrderingKey: e.OrderingKey, Due: e.Due})
	}
	next := ""
	if len(es) >= limit {
		last := es[len(es)-1]
		next = last.Due.UTC().Format(time.RFC3339Nano) + "~" + last.ID
	}
	return v, next, nil
}

func (h *handler) apiScheduled(w http.ResponseWriter, r *http.Request) {
	after, limit, err := parsePage(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	es, next, err := h.scheduled(r, after, cmpOr(limit, 100))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Events []ScheduledEvent `json:"events"`
		// Next is the after of the next page, or "" on the last one.
		Next string `json:"next,omitempty"`
	}{es, next})
}

// cancel takes event id back before it is due (Outbox.Cancel), and
// writes it to the audit log. why says why it could not.
func (h *handler) cancel(r *http.Request, id string) (ok bool, why string, err error) {
	ok, err = h.ob.Cancel(r.Context(), id)
	h.audit(r, "cancel", err, slog.String("id", id), slog.Bool("cancelled", ok))
	switch {
	case errors.Is(err, outbox.ErrNotFound):
		return false, "no such event", nil
	case errors.Is(err, outbox.ErrOrderedNotCancellable):
		return false, "it is ordered: the later events of its key wait behind it (publish a compensating event instead)", nil
	case err != nil:
		return false, "", err
	case !ok:
		return false, "it is due already, being delivered, or done", nil
	}
	return true, "", nil
}

// cancelID reads the one event id to cancel.
func cancelID(r *http.Request) (string, error) {
	id := strings.TrimSpace(r.PostFormValue("id"))
	if id == "" {
		return "", errors.New("give the id of the event to cancel (id)")
	}
	return id, nil
}

func (h *handler) apiCancel(w http.ResponseWriter, r *http.Request) {
	id, err := cancelID(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ok, why, err := h.cancel(r, id)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "cancel: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": "cancel", "id": id, "cancelled": ok, "why": why})
}

type scheduledPage struct {
	Events          []ScheduledEvent
	Next, FirstPage string
}

func (h *handler) pageScheduled(w http.ResponseWriter, r *http.Request) {
	after, _, err := parsePage(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	es, next, err := h.scheduled(r, after, deadPageSize)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	d := scheduledPage{Events: es}
	if next != "" {
		d.Next = h.base + "/scheduled?" + url.Values{"after": {next}}.Encode()
	}
	if after != "" {
		d.FirstPage = h.base + "/scheduled"
	}
	h.render(w, r, http.StatusOK, "scheduled.html", "Scheduled events", d)
}

// pageCancel cancels the posted event: without confirm=1 it asks to
// confirm, changing nothing; with it, it cancels and redirects to the
// scheduled events with what happened.
func (h *handler) pageCancel(w http.ResponseWriter, r *http.Request) {
	id, err := cancelID(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if r.PostFormValue("confirm") != "1" {
		h.render(w, r, http.StatusOK, "cancel.html", "Confirm cancel", struct{ ID string }{id})
		return
	}
	ok, why, err := h.cancel(r, id)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, "cancel: "+err.Error())
		return
	}
	notice := "Cancelled " + id
	if !ok {
		notice = "Not cancelled: " + why
	}
	h.redirect(w, r, "/scheduled", nil, notice)
}

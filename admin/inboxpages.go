package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/inbox"
)

// inboxPageSize is how many parked messages a page lists.
const inboxPageSize = 50

type inboxListPage struct {
	Consumer  string   // the filter, or ""
	Entries   []Parked // never with a payload
	Next      string   // the URL of the next page, or ""
	FirstPage string
}

// pageInbox lists the parked messages of package inbox, one consumer's
// (?consumer=) or all, 50 a page: consumer, id, attempts, last error and
// when it was parked; never a payload.
func (h *handler) pageInbox(w http.ResponseWriter, r *http.Request) {
	if h.noInbox(w, r) {
		return
	}
	consumer := r.FormValue("consumer")
	f := inbox.ParkedFilter{Consumer: consumer, AfterConsumer: r.FormValue("after_consumer"), AfterID: r.FormValue("after_id"), Limit: inboxPageSize}
	entries, err := h.cfg.Inbox.Parked(r.Context(), f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := inboxListPage{Consumer: consumer}
	for _, e := range entries {
		d.Entries = append(d.Entries, Parked{Consumer: e.Consumer, ID: e.Message.ID, ParkedAt: e.ReceivedAt, Attempts: e.Attempts, LastError: e.LastError, PayloadBytes: len(e.Message.Payload)})
	}
	q := url.Values{}
	if consumer != "" {
		q.Set("consumer", consumer)
	}
	if len(entries) == inboxPageSize {
		last := entries[len(entries)-1]
		next := url.Values{"after_consumer": {last.Consumer}, "after_id": {last.Message.ID}}
		if consumer != "" {
			next.Set("consumer", consumer)
		}
		d.Next = h.base + "/inbox?" + next.Encode()
	}
	if f.AfterID != "" || f.AfterConsumer != "" {
		d.FirstPage = h.base + "/inbox?" + q.Encode()
	}
	h.render(w, r, http.StatusOK, "inbox.html", "Parked messages", d)
}

type inboxEntryPage struct {
	Entry     Parked
	CanReplay bool
	Shown     bool
	Headers   string
	Payload   string
}

// parkedEntry reads the parked message of the request's path; it answers
// (404, 500) and returns false if it cannot.
func (h *handler) parkedEntry(w http.ResponseWriter, r *http.Request) (inbox.Entry, bool) {
	if h.noInbox(w, r) {
		return inbox.Entry{}, false
	}
	e, err := h.cfg.Inbox.Entry(r.Context(), r.PathValue("consumer"), r.PathValue("id"))
	if err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, inbox.ErrNotParked) {
			status = http.StatusNotFound
		}
		h.fail(w, r, status, err.Error())
		return inbox.Entry{}, false
	}
	return e, true
}

// pageInboxEntry shows one parked message; its payload and headers only
// with ?payload=1, which the audit log records.
func (h *handler) pageInboxEntry(w http.ResponseWriter, r *http.Request) {
	e, ok := h.parkedEntry(w, r)
	if !ok {
		return
	}
	shown, _ := strconv.ParseBool(r.FormValue("payload"))
	d := inboxEntryPage{Entry: parkedOf(e), CanReplay: h.cfg.InboxHandlers[e.Consumer] != nil, Shown: shown}
	if shown {
		h.audit(r, "inbox show_payload", nil, slog.String("consumer", e.Consumer), slog.String("id", e.Message.ID))
		if len(e.Message.Headers) > 0 {
			b, _ := json.MarshalIndent(e.Message.Headers, "", "  ")
			d.Headers = string(b)
		}
		d.Payload = showPayload(e.Message.Payload)
	}
	h.render(w, r, http.StatusOK, "inboxentry.html", "Parked message "+e.Message.ID, d)
}

func parkedOf(e inbox.Entry) Parked {
	return Parked{Consumer: e.Consumer, ID: e.Message.ID, ParkedAt: e.ReceivedAt, Attempts: e.Attempts, LastError: e.LastError,
		Headers: e.Message.Headers, PayloadBytes: len(e.Message.Payload)}
}

// showPayload is a payload as the page prints it: JSON indented, other
// text as it is, anything else in hex.
func showPayload(p []byte) string {
	switch {
	case len(p) == 0:
		return "(empty)"
	case json.Valid(p):
		return indent(p)
	case utf8.Valid(p):
		return string(p)
	default:
		return fmt.Sprintf("(%d bytes, not text) %x", len(p), p)
	}
}

type inboxConfirmPage struct {
	Action string // "replay" or "purge"
	Entry  Parked
}

// pageInboxAction replays or purges one parked message: without
// confirm=1 it shows the message and asks to confirm, changing nothing;
// with it, it acts (audited) and redirects with the outcome.
func (h *handler) pageInboxAction(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		e, ok := h.parkedEntry(w, r)
		if !ok {
			return
		}
		if action == "replay" && h.cfg.InboxHandlers[e.Consumer] == nil {
			h.fail(w, r, http.StatusNotImplemented, fmt.Sprintf("no handler for inbox consumer %q: add it to admin.Config.InboxHandlers", e.Consumer))
			return
		}
		if r.PostFormValue("confirm") != "1" {
			h.render(w, r, http.StatusOK, "inboxconfirm.html", "Confirm "+action, inboxConfirmPage{Action: action, Entry: parkedOf(e)})
			return
		}
		back := url.Values{"consumer": {e.Consumer}}
		if action == "purge" {
			n, err := h.inboxPurge(r, e.Consumer, []string{e.Message.ID})
			if err != nil {
				h.fail(w, r, http.StatusInternalServerError, err.Error())
				return
			}
			notice := "Purged " + e.Message.ID + " of " + e.Consumer
			if n == 0 {
				notice = "Nothing purged: " + e.Message.ID + " of " + e.Consumer + " was no longer parked"
			}
			h.redirect(w, r, "/inbox", back, notice)
			return
		}
		res, status, err := h.inboxReplay(r, e.Consumer, e.Message.ID)
		switch {
		case status != 0:
			h.fail(w, r, status, err.Error())
		case res == inbox.Applied:
			h.redirect(w, r, "/inbox", back, "Replayed "+e.Message.ID+" of "+e.Consumer+": applied")
		default:
			h.redirect(w, r, "/inbox/"+url.PathEscape(e.Consumer)+"/"+url.PathEscape(e.Message.ID), nil,
				"Replay of "+e.Message.ID+" failed again, still parked: "+fmt.Sprint(err))
		}
	}
}

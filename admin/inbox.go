package admin

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/inbox"
)

// Parked is a parked inbox message as the API shows it: never its
// payload, only its size.
type Parked struct {
	Consumer     string            `json:"consumer"`
	ID           string            `json:"id"`
	ParkedAt     time.Time         `json:"parked_at"`
	Attempts     int               `json:"attempts"`
	LastError    string            `json:"last_error"`
	Headers      map[string]string `json:"headers,omitempty"`
	PayloadBytes int               `json:"payload_bytes"`
}

// noInbox answers when Config.Inbox is not set; it reports whether it did.
func (h *handler) noInbox(w http.ResponseWriter, r *http.Request) bool {
	if h.cfg.Inbox == nil {
		h.fail(w, r, http.StatusNotFound, "no inbox: set admin.Config.Inbox")
		return true
	}
	return false
}

// apiInbox lists parked messages: ?consumer=&after_consumer=&after_id=&limit=.
func (h *handler) apiInbox(w http.ResponseWriter, r *http.Request) {
	if h.noInbox(w, r) {
		return
	}
	limit := 100
	if v := r.FormValue("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 1000 {
			h.fail(w, r, http.StatusBadRequest, "limit: want 1 to 1000")
			return
		}
		limit = n
	}
	entries, err := h.cfg.Inbox.Parked(r.Context(), inbox.ParkedFilter{Consumer: r.FormValue("consumer"),
		AfterConsumer: r.FormValue("after_consumer"), AfterID: r.FormValue("after_id"), Limit: limit})
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	out := make([]Parked, len(entries))
	for i, e := range entries {
		out[i] = Parked{Consumer: e.Consumer, ID: e.Message.ID, ParkedAt: e.ReceivedAt, Attempts: e.Attempts, LastError: e.LastError,
			Headers: e.Message.Headers, PayloadBytes: len(e.Message.Payload)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"parked": out})
}

// apiInboxReplay replays one parked message (consumer, id) with the
// consumer's handler from Config.InboxHandlers.
func (h *handler) apiInboxReplay(w http.ResponseWriter, r *http.Request) {
	if h.noInbox(w, r) {
		return
	}
	consumer, id := strings.TrimSpace(r.FormValue("consumer")), strings.TrimSpace(r.FormValue("id"))
	if consumer == "" || id == "" {
		h.fail(w, r, http.StatusBadRequest, "consumer and id are required")
		return
	}
	res, status, err := h.inboxReplay(r, consumer, id)
	switch {
	case status != 0:
		h.fail(w, r, status, err.Error())
	case res == inbox.Applied:
		writeJSON(w, http.StatusOK, map[string]any{"result": res.String()})
	default:
		writeJSON(w, http.StatusConflict, map[string]any{"result": res.String(), "error": fmt.Sprint(err)})
	}
}

// inboxReplay replays one parked message with the consumer's handler from
// Config.InboxHandlers, and audits it. A status is set when the message
// could not be replayed at all (no handler: 501; not parked: 404); a
// handler that failed again gives Parked and its error, with status 0.
func (h *handler) inboxReplay(r *http.Request, consumer, id string) (inbox.Result, int, error) {
	hd := h.cfg.InboxHandlers[consumer]
	if hd == nil {
		return inbox.Failed, http.StatusNotImplemented, fmt.Errorf("no handler for inbox consumer %q: add it to admin.Config.InboxHandlers", consumer)
	}
	res, err := h.cfg.Inbox.Replay(r.Context(), consumer, id, hd)
	h.audit(r, "inbox replay", err, slog.String("consumer", consumer), slog.String("id", id), slog.String("result", res.String()))
	if errors.Is(err, inbox.ErrNotParked) {
		return res, http.StatusNotFound, err
	}
	return res, 0, err
}

// apiInboxPurge purges parked messages: consumer and one id per "id".
func (h *handler) apiInboxPurge(w http.ResponseWriter, r *http.Request) {
	if h.noInbox(w, r) {
		return
	}
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	consumer, ids := strings.TrimSpace(r.FormValue("consumer")), r.Form["id"]
	if consumer == "" || len(ids) == 0 {
		h.fail(w, r, http.StatusBadRequest, "consumer and at least one id are required")
		return
	}
	n, err := h.inboxPurge(r, consumer, ids)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("purge: %d done, then: %v", n, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": n})
}

// inboxPurge purges parked messages of consumer and audits it.
func (h *handler) inboxPurge(r *http.Request, consumer string, ids []string) (int64, error) {
	n, err := h.cfg.Inbox.Purge(r.Context(), consumer, ids...)
	h.audit(r, "inbox purge", err, slog.String("consumer", consumer), slog.Int("ids", len(ids)), slog.Int64("count", n))
	return n, err
}

package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/txoutbox/txoutbox/outbox"
)

func (h *handler) routes() {
	m := http.NewServeMux()
	b := h.base
	// JSON API.
	m.HandleFunc("GET "+b+"/api/csrf", h.apiCSRF)
	m.HandleFunc("GET "+b+"/api/subscriptions", h.apiSubscriptions)
	m.HandleFunc("POST "+b+"/api/subscriptions/{name}/pause", h.apiPause(true))
	m.HandleFunc("POST "+b+"/api/subscriptions/{name}/resume", h.apiPause(false))
	m.HandleFunc("POST "+b+"/api/subscriptions/{name}/retire", h.apiRetire)
	m.HandleFunc("GET "+b+"/api/stats", h.apiStats)
	m.HandleFunc("GET "+b+"/api/dead", h.apiDead)
	m.HandleFunc("POST "+b+"/api/dead/replay", h.apiReplay)
	m.HandleFunc("POST "+b+"/api/dead/purge", h.apiPurge)
	m.HandleFunc("POST "+b+"/api/dead/skip", h.apiSkip)
	m.HandleFunc("GET "+b+"/api/blocked", h.apiBlocked)
	m.HandleFunc("GET "+b+"/api/scheduled", h.apiScheduled)
	m.HandleFunc("GET "+b+"/api/archive", h.apiArchive)
	m.HandleFunc("POST "+b+"/api/scheduled/cancel", h.apiCancel)
	m.HandleFunc("GET "+b+"/api/events/{id}", h.apiEvent)
	m.HandleFunc("GET "+b+"/api/inbox", h.apiInbox)
	m.HandleFunc("POST "+b+"/api/inbox/replay", h.apiInboxReplay)
	m.HandleFunc("POST "+b+"/api/inbox/purge", h.apiInboxPurge)
	// Pages.
	m.HandleFunc("GET "+b+"/{$}", h.pageIndex)
	if b != "" {
		m.HandleFunc("GET "+b, func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, b+"/", http.StatusSeeOther) })
	}
	m.HandleFunc("POST "+b+"/subscriptions/{name}/pause", h.pagePause(true))
	m.HandleFunc("POST "+b+"/subscriptions/{name}/resume", h.pagePause(false))
	m.HandleFunc("POST "+b+"/subscriptions/{name}/retire", h.pageRetire)
	m.HandleFunc("GET "+b+"/dead", h.pageDead)
	m.HandleFunc("POST "+b+"/dead/replay", h.pageBulk("replay"))
	m.HandleFunc("POST "+b+"/dead/purge", h.pageBulk("purge"))
	m.HandleFunc("GET "+b+"/blocked", h.pageBlocked)
	m.HandleFunc("POST "+b+"/blocked/skip", h.pageSkip)
	m.HandleFunc("GET "+b+"/scheduled", h.pageScheduled)
	m.HandleFunc("GET "+b+"/archive", h.pageArchive)
	m.HandleFunc("POST "+b+"/scheduled/cancel", h.pageCancel)
	m.HandleFunc("GET "+b+"/event", h.pageLookup)
	m.HandleFunc("GET "+b+"/events/{id}", h.pageEvent)
	m.HandleFunc("GET "+b+"/inbox", h.pageInbox)
	m.HandleFunc("GET "+b+"/inbox/{consumer}/{id}", h.pageInboxEntry)
	m.HandleFunc("POST "+b+"/inbox/{consumer}/{id}/replay", h.pageInboxAction("replay"))
	m.HandleFunc("POST "+b+"/inbox/{consumer}/{id}/purge", h.pageInboxAction("purge"))
	h.mux = m
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// Subscription is a subscription as the API and the page show it.
type Subscription struct {
	Name string `json:"name"`
	// Types are the event types it takes; empty: every type.
	Types []string `json:"types,omitempty"`
	// Local: this instance runs it; otherwise another instance registered
	// it in the database.
	Local bool `json:"local"`
	// Paused on every instance.
	Paused bool `json:"paused"`
	// Circuit is the state of its circuit on this instance ("" for the
	// others' subscriptions).
	Circuit string `json:"circuit,omitempty"`
	// Rate is its rate limit on this instance, in events a second (0:
	// none, or another instance's subscription).
	Rate float64 `json:"rate,omitempty"`
	// Lag is what it has not delivered yet; nil if the store cannot tell.
	Lag *Lag `json:"lag,omitempty"`
	// Unregistered: no instance registers it (retired, or unknown), yet
	// it holds deliveries, which nothing delivers; retiring it settles
	// them.
	Unregistered bool `json:"unregistered,omitempty"`
}

// Lag is what a subscription has not delivered yet (outbox.Lag).
type Lag struct {
	Pending  int64 `json:"pending"`
	Retrying int64 `json:"retrying"`
	Dead     int64 `json:"dead"`
	// OldestSeconds is the age of the oldest pending or retrying event.
	OldestSeconds float64 `json:"oldest_seconds"`
	// BlockedKeys counts the ordering keys blocked for it (up to 100).
	BlockedKeys int64 `json:"blocked_keys"`
}

// subscriptions returns ob's subscriptions with their lag; lagErr reports
// a failed lag query, which leaves the lags out.
func (h *handler) subscriptions(r *http.Request) (subs []Subscription, lagErr error) {
	lags := map[string]outbox.Lag{}
	ls, lagErr := h.ob.Lag(r.Context())
	for _, l := range ls {
		lags[l.Subscription] = l
	}
	for _, s := range h.ob.Subscriptions() {
		v := Subscription{Name: s.Name, Local: s.Local, Paused: s.Paused, Circuit: string(s.Circuit), Rate: s.Rate}
		for _, t := range s.Types {
			v.Types = append(v.Types, string(t))
		}
		if l, ok := lags[s.Name]; ok {
			v.Lag = &Lag{Pending: l.Pending, Retrying: l.Retrying, Dead: l.Dead, OldestSeconds: l.Oldest.Seconds(), BlockedKeys: l.BlockedKeys}
		}
		subs = append(subs, v)
	}
	for _, l := range ls {
		if l.Unregistered {
			subs = append(subs, Subscription{Name: l.Subscription, Unregistered: true,
				Lag: &Lag{Pending: l.Pending, Retrying: l.Retrying, Dead: l.Dead, OldestSeconds: l.Oldest.Seconds(), BlockedKeys: l.BlockedKeys}})
		}
	}
	return subs, lagErr
}

func (h *handler) apiCSRF(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"who": whoOf(r), "token": h.token(whoOf(r)), "header": csrfHeader, "field": csrfField})
}

func (h *handler) apiSubscriptions(w http.ResponseWriter, r *http.Request) {
	subs, err := h.subscriptions(r)
	v := map[string]any{"subscriptions": subs}
	if err != nil {
		v["lag_error"] = err.Error()
	}
	writeJSON(w, http.StatusOK, v)
}

// setPaused pauses or resumes the subscription named in the path, and
// writes it to the audit log.
func (h *handler) setPaused(r *http.Request, pause bool) (name string, status int, err error) {
	name = r.PathValue("name")
	action := "resume"
	if pause {
		action = "pause"
	}
	if !slices.ContainsFunc(h.ob.Subscriptions(), func(s outbox.SubscriptionStatus) bool { return s.Name == name }) {
		err = fmt.Errorf("no subscription named %q", name)
		h.audit(r, action, err, slog.String("subscription", name))
		return name, http.StatusNotFound, err
	}
	if pause {
		err = h.ob.Pause(r.Context(), name)
	} else {
		err = h.ob.Resume(r.Context(), name)
	}
	h.audit(r, action, err, slog.String("subscription", name))
	if err != nil {
		return name, http.StatusInternalServerError, err
	}
	return name, http.StatusOK, nil
}

func (h *handler) apiPause(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, status, err := h.setPaused(r, pause)
		if err != nil {
			h.fail(w, r, status, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"subscription": name, "paused": pause})
	}
}

func (h *handler) apiStats(w http.ResponseWriter, r *http.Request) {
	st, err := h.ob.Stats(r.Context())
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	// dead is the dead letters, as /api/dead lists them: the events dead
	// as a whole and the dead deliveries of split events.
	writeJSON(w, http.StatusOK, map[string]any{"new": st.New, "retry": st.Retry, "done": st.Done, "dead": st.DeadLetters(), "dead_events": st.Dead, "dead_deliveries": st.DeadDeliveries,
		"split": st.Split, "oldest_pending_seconds": st.OldestPending.Seconds()})
}

// DeadLetter is a dead letter as the API lists it (outbox.DeadLetter):
// no payload.
type DeadLetter struct {
	ID            string    `json:"id"`
	Subscription  string    `json:"subscription,omitempty"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	TenantID      string    `json:"tenant_id,omitempty"`
	Attempts      int       `json:"attempts"`
	LastError     string    `json:"last_error,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
}

func deadLetter(d outbox.DeadLetter) DeadLetter {
	return DeadLetter{ID: d.ID, Subscription: d.Subscription, Type: d.Type, AggregateType: d.AggregateType, AggregateID: d.AggregateID, TenantID: d.TenantID, Attempts: d.Attempts, LastError: d.LastError, CreatedAt: d.CreatedAt}
}

// maxLimit bounds a page of dead letters.
const maxLimit = 500

// parseFilter reads a dead-letter filter from the query and form:
// subscription, type, error, since and until (RFC 3339, or the
// 2006-01-02T15:04 of an HTML datetime-local field, in UTC), after and
// limit.
func parseFilter(r *http.Request) (outbox.DeadFilter, error) {
	f := outbox.DeadFilter{
		Subscription:  strings.TrimSpace(r.FormValue("subscription")),
		Type:          strings.TrimSpace(r.FormValue("type")),
		ErrorContains: strings.TrimSpace(r.FormValue("error")),
		After:         strings.TrimSpace(r.FormValue("after")),
	}
	var err error
	if f.Since, err = parseTime("since", r.FormValue("since")); err != nil {
		return f, err
	}
	if f.Until, err = parseTime("until", r.FormValue("until")); err != nil {
		return f, err
	}
	if s := r.FormValue("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			return f, fmt.Errorf("limit %q: want 1 to %d", s, maxLimit)
		}
		f.Limit = n
	}
	return f, nil
}

func parseTime(name, s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q: want a time like 2006-01-02T15:04:05Z", name, s)
}

func filterAttrs(f outbox.DeadFilter) slog.Attr {
	var as []any
	for _, kv := range [][2]string{{"subscription", f.Subscription}, {"type", f.Type}, {"error", f.ErrorContains}} {
		if kv[1] != "" {
			as = append(as, slog.String(kv[0], kv[1]))
		}
	}
	if !f.Since.IsZero() {
		as = append(as, slog.Time("since", f.Since))
	}
	if !f.Until.IsZero() {
		as = append(as, slog.Time("until", f.Until))
	}
	return slog.Group("filter", as...)
}

func (h *handler) apiDead(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	f.Limit = cmpOr(f.Limit, 100)
	dls, err := h.ob.Dead(r.Context(), f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	v := struct {
		Letters []DeadLetter `json:"letters"`
		// Next is the after of the next page, or "" on the last one.
		Next string `json:"next,omitempty"`
	}{Letters: []DeadLetter{}}
	for _, d := range dls {
		v.Letters = append(v.Letters, deadLetter(d))
	}
	if len(dls) >= f.Limit {
		v.Next = dls[len(dls)-1].ID
	}
	writeJSON(w, http.StatusOK, v)
}

func cmpOr(n, def int) int {
	if n == 0 {
		return def
	}
	return n
}

// errNoPurge answers a purge when the store cannot purge.
var errNoPurge = errors.New("purge needs a store that implements admin.Purger (set Config.Store to the *sqlstore.Store)")

// bulk replays or purges (action) the dead letters f selects, or counts
// them with dryRun, and writes it to the audit log.
func (h *handler) bulk(r *http.Request, action string, f outbox.DeadFilter, dryRun bool) (int, error) {
	f.After, f.Limit = "", 0
	var n int
	var err error
	switch {
	case action == "replay":
		n, err = h.ob.Replay(r.Context(), f, dryRun)
	case h.purger == nil:
		err = errNoPurge
	default:
		n, err = h.purge(r, f, dryRun)
	}
	h.audit(r, action, err, slog.Bool("dry_run", dryRun), filterAttrs(f), slog.Int("count", n))
	return n, err
}

// purge deletes the dead letters f selects, a page at a time.
func (h *handler) purge(r *http.Request, f outbox.DeadFilter, dryRun bool) (int, error) {
	f.Limit = maxLimit
	total := 0
	for {
		page, err := h.ob.Dead(r.Context(), f)
		if err != nil || len(page) == 0 {
			return total, err
		}
		f.After = page[len(page)-1].ID
		if dryRun {
			total += len(page)
			continue
		}
		n, err := h.purger.PurgeLetters(r.Context(), page)
		total += n
		if err != nil {
			return total, err
		}
	}
}

func (h *handler) apiBulk(w http.ResponseWriter, r *http.Request, action string) {
	f, err := parseFilter(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	dryRun, _ := strconv.ParseBool(r.FormValue("dry_run"))
	all, _ := strconv.ParseBool(r.FormValue("all"))
	if action == "purge" && h.purger == nil {
		h.fail(w, r, http.StatusNotImplemented, errNoPurge.Error())
		return
	}
	if !dryRun && !all && !filtered(f) {
		h.fail(w, r, http.StatusBadRequest, fmt.Sprintf("%s without a filter would %s every dead letter: add all=true to do that, a filter (subscription, type, error, since, until) to select some, or dry_run=1 to count them", action, action))
		return
	}
	n, err := h.bulk(r, action, f, dryRun)
	if errors.Is(err, errNoPurge) {
		h.fail(w, r, http.StatusNotImplemented, err.Error())
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("%s: %d done, then: %v", action, n, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": action, "dry_run": dryRun, "count": n})
}

// filtered reports whether f selects by anything but the page.
func filtered(f outbox.DeadFilter) bool {
	return f.Subscription != "" || f.Type != "" || f.ErrorContains != "" || !f.Since.IsZero() || !f.Until.IsZero()
}

func (h *handler) apiReplay(w http.ResponseWriter, r *http.Request) { h.apiBulk(w, r, "replay") }
func (h *handler) apiPurge(w http.ResponseWriter, r *http.Request)  { h.apiBulk(w, r, "purge") }

// Event is an event as the API shows it (outbox.Record).
type Event struct {
	ID            string    `json:"id"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	TenantID      string    `json:"tenant_id,omitempty"`
	Status        string    `json:"status"`
	Attempts      int       `json:"attempts"`
	Owner         string    `json:"owner,omitempty"`
	LastError     string    `json:"last_error,omitempty"`
	ReadError     string    `json:"read_error,omitempty"`
	CreatedAt     time.Time `json:"created_at"`
	OccurredAt    time.Time `json:"occurred_at"`
	// DeliveredAt and DeliveredBy are set for an event found in the
	// archive (sqlstore's Options.ArchiveDelivered).
	DeliveredAt *time.Time `json:"delivered_at,omitempty"`
	DeliveredBy string     `json:"delivered_by,omitempty"`
	// Headers and Payload are present only when asked for (payload=1).
	Headers json.RawMessage `json:"headers,omitempty"`
	// Payload is the JSON payload as is, or a JSON string of the text
	// (PayloadBase64 for bytes that are not UTF-8).
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 []byte          `json:"payload_base64,omitempty"`
	// Deliveries is the state of each subscription that did not deliver
	// the event at the first try, with its last failed attempts.
	Deliveries []Delivery `json:"deliveries"`
}

// Delivery is one subscription's delivery of an event.
type Delivery struct {
	Subscription string    `json:"subscription"`
	Status       string    `json:"status"`
	Attempts     int       `json:"attempts"`
	Owner        string    `json:"owner,omitempty"`
	LastError    string    `json:"last_error,omitempty"`
	History      []Attempt `json:"history"`
	// Inferred: the store keeps no state of this subscription's own for
	// the event; Status is the event's (a subscription of this instance
	// that takes its type and has no record delivered it at the first
	// try, or, for an event not split, shares its state).
	Inferred bool `json:"inferred,omitempty"`
}

// Attempt is one failed attempt, newest first in a Delivery's History.
type Attempt struct {
	N     int       `json:"n"`
	At    time.Time `json:"at"`
	Error string    `json:"error"`
}

func statusName(s outbox.Status) string {
	if s == outbox.StatusSplit {
		return "split"
	}
	return s.String()
}

func event(rec outbox.Record, payload bool) Event {
	ev := Event{ID: rec.ID, Type: rec.Type, AggregateType: rec.AggregateType, AggregateID: rec.AggregateID, TenantID: rec.TenantID,
		Status: statusName(rec.Status), Attempts: rec.Attempts, Owner: rec.Owner, LastError: rec.LastError, CreatedAt: rec.CreatedAt, OccurredAt: rec.OccurredAt, Deliveries: []Delivery{}}
	if rec.ReadError != nil {
		ev.ReadError = rec.ReadError.Error()
	}
	if rec.Archived() {
		at := rec.DeliveredAt
		ev.DeliveredAt, ev.DeliveredBy = &at, rec.DeliveredBy
	}
	if payload {
		if json.Valid(rec.Headers) {
			ev.Headers = rec.Headers
		}
		switch {
		case rec.PayloadJSON && json.Valid(rec.Payload):
			ev.Payload = rec.Payload
		case utf8.Valid(rec.Payload):
			ev.Payload, _ = json.Marshal(string(rec.Payload))
		default:
			ev.PayloadBase64 = rec.Payload
		}
	}
	for _, d := range rec.Deliveries {
		v := Delivery{Subscription: d.Subscription, Status: statusName(d.Status), Attempts: d.Attempts, Owner: d.Owner, LastError: d.LastError, History: []Attempt{}}
		for _, a := range d.History {
			v.History = append(v.History, Attempt{N: a.N, At: a.At, Error: a.Error})
		}
		ev.Deliveries = append(ev.Deliveries, v)
	}
	return ev
}

// inferDeliveries adds to ev the subscriptions of subs that take its
// type and have no delivery record: for a split event they delivered it
// at the first try; otherwise they share the event's state.
func inferDeliveries(ev *Event, subs []outbox.SubscriptionStatus) {
	status := ev.Status
	if status == "split" {
		status = "done"
	}
	for _, s := range subs {
		if len(s.Types) > 0 && !slices.Contains(s.Types, outbox.EventType(ev.Type)) {
			continue
		}
		if slices.ContainsFunc(ev.Deliveries, func(d Delivery) bool { return d.Subscription == s.Name }) {
			continue
		}
		ev.Deliveries = append(ev.Deliveries, Delivery{Subscription: s.Name, Status: status, History: []Attempt{}, Inferred: true})
	}
	slices.SortFunc(ev.Deliveries, func(a, b Delivery) int { return strings.Compare(a.Subscription, b.Subscription) })
}

// lookup inspects the event named in the path; with payload, the
// payload is shown and the audit log says so.
func (h *handler) lookup(r *http.Request, payload bool) (Event, int, error) {
	id := r.PathValue("id")
	rec, err := h.ob.Inspect(r.Context(), id)
	if payload {
		h.audit(r, "show_payload", err, slog.String("event", id))
	}
	if errors.Is(err, outbox.ErrNotFound) {
		return Event{}, http.StatusNotFound, fmt.Errorf("no event %q", id)
	}
	if err != nil {
		return Event{}, http.StatusInternalServerError, err
	}
	ev := event(rec, payload)
	inferDeliveries(&ev, h.ob.Subscriptions())
	return ev, http.StatusOK, nil
}

func (h *handler) apiEvent(w http.ResponseWriter, r *http.Request) {
	payload, _ := strconv.ParseBool(r.FormValue("payload"))
	ev, status, err := h.lookup(r, payload)
	if err != nil {
		h.fail(w, r, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, ev)
}

// BlockedKey is an ordering key held back by a dead event, as the API
// shows it (outbox.BlockedKey).
type BlockedKey struct {
	Key string `json:"key"`
	// Subscription is the subscription the key is blocked for (its later
	// events still reach the others); "" when the event is dead as a
	// whole, which blocks every Ordered subscription.
	Subscription string `json:"subscription"`
	// EventID and Type are the dead event's: replay or skip it.
	EventID string `json:"event_id"`
	Type    string `json:"type"`
	// Waiting counts the key's later events held back for Subscription.
	Waiting int64     `json:"waiting"`
	Since   time.Time `json:"since"`
}

// parsePage reads after and limit (1 to maxLimit; 0 when absent).
func parsePage(r *http.Request) (after string, limit int, err error) {
	after = r.FormValue("after")
	if s := r.FormValue("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > maxLimit {
			return after, 0, fmt.Errorf("limit %q: want 1 to %d", s, maxLimit)
		}
		limit = n
	}
	return after, limit, nil
}

// blocked returns a page of blocked keys after after, and the after of
// the next page ("" on the last one).
func (h *handler) blocked(r *http.Request, after string, limit int) ([]BlockedKey, string, error) {
	ks, err := h.ob.BlockedKeys(r.Context(), after, limit)
	if err != nil {
		return nil, "", err
	}
	v := []BlockedKey{}
	for _, k := range ks {
		v = append(v, BlockedKey{Key: k.Key, Subscription: k.Subscription, EventID: k.EventID, Type: k.Type, Waiting: k.Waiting, Since: k.Since})
	}
	next := ""
	if len(ks) >= limit {
		next = ks[len(ks)-1].Key
	}
	return v, next, nil
}

func (h *handler) apiBlocked(w http.ResponseWriter, r *http.Request) {
	after, limit, err := parsePage(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ks, next, err := h.blocked(r, after, cmpOr(limit, 100))
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Keys []BlockedKey `json:"keys"`
		// Next is the after of the next page, or "" on the last one.
		Next string `json:"next,omitempty"`
	}{ks, next})
}

// maxSkip bounds the event ids of one skip.
const maxSkip = 100

// skipIDs reads the event ids to skip (id, repeated).
func skipIDs(r *http.Request) ([]string, error) {
	r.ParseForm()
	var ids []string
	for _, id := range r.Form["id"] {
		if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == 0:
		return nil, errors.New("give the id of the dead event to skip (id)")
	case len(ids) > maxSkip:
		return nil, fmt.Errorf("%d ids: skip at most %d at once", len(ids), maxSkip)
	}
	return ids, nil
}

// skip gives up on the dead events ids for good (Outbox.SkipDead), and
// writes it to the audit log.
func (h *handler) skip(r *http.Request, ids []string) (int, error) {
	n, err := h.ob.SkipDead(r.Context(), ids...)
	h.audit(r, "skip", err, slog.Any("ids", ids), slog.Int("count", n))
	return n, err
}

func (h *handler) apiSkip(w http.ResponseWriter, r *http.Request) {
	ids, err := skipIDs(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	n, err := h.skip(r, ids)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("skip: %d done, then: %v", n, err))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"action": "skip", "count": n})
}

package admin

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/txoutbox/txoutbox/outbox"
)

// Retiring a subscription (outbox.Outbox.Retire), guarded like a purge:
// without confirm=1 it only says what the subscription still holds.

// RetireResult is what the API answers for a retire.
type RetireResult struct {
	Subscription string `json:"subscription"`
	// Retired is false for the dry run (no confirm=1).
	Retired bool `json:"retired"`
	// Holds is what the subscription holds now (before a retire), as Lag
	// counts it; nil if the store cannot tell.
	Holds *Lag `json:"holds,omitempty"`
	// Registered, Dropped and Completed are outbox.Retired's.
	Registered bool  `json:"registered,omitempty"`
	Dropped    int64 `json:"dropped,omitempty"`
	Completed  int64 `json:"events_completed,omitempty"`
}

// retire retires the subscription named in the path, or with dry only
// reports what it holds.
func (h *handler) retire(r *http.Request, dry bool) (RetireResult, int, error) {
	name := r.PathValue("name")
	v := RetireResult{Subscription: name}
	if lags, err := h.ob.Lag(r.Context()); err == nil {
		for _, l := range lags {
			if l.Subscription == name {
				v.Holds = &Lag{Pending: l.Pending, Retrying: l.Retrying, Dead: l.Dead, OldestSeconds: l.Oldest.Seconds(), BlockedKeys: l.BlockedKeys}
			}
		}
	}
	if dry {
		return v, http.StatusOK, nil
	}
	res, err := h.ob.Retire(r.Context(), name)
	h.audit(r, "retire", err, slog.String("subscription", name), slog.Int64("dropped", res.Dropped), slog.Int64("events_completed", res.Completed))
	switch {
	case errors.Is(err, outbox.ErrSubscriptionLive):
		return v, http.StatusConflict, err
	case err != nil:
		return v, http.StatusInternalServerError, err
	}
	v.Retired, v.Registered, v.Dropped, v.Completed = true, res.Registered, res.Dropped, res.Completed
	return v, http.StatusOK, nil
}

// apiRetire answers POST /api/subscriptions/{name}/retire: a dry run
// unless confirm=1.
func (h *handler) apiRetire(w http.ResponseWriter, r *http.Request) {
	v, status, err := h.retire(r, r.FormValue("confirm") != "1")
	if err != nil {
		h.fail(w, r, status, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// pageRetire asks to confirm (without confirm=1), then retires and goes
// back to the subscriptions with the counts.
func (h *handler) pageRetire(w http.ResponseWriter, r *http.Request) {
	confirm := r.PostFormValue("confirm") == "1"
	v, status, err := h.retire(r, !confirm)
	if err != nil {
		h.fail(w, r, status, err.Error())
		return
	}
	if !confirm {
		h.render(w, r, http.StatusOK, "retire.html", "Confirm retire", v)
		return
	}
	h.redirect(w, r, "/", nil, fmt.Sprintf("Retired %s: %d deliveries dropped, %d events completed", v.Subscription, v.Dropped, v.Completed))
}

package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync/atomic"
	"time"
)

// health holds what the health checks watch; the parts update it.
type health struct {
	pollBeat      atomic.Int64 // unix nanoseconds of the poller's last cycle
	completeFails atomic.Int64 // completion writes failed since the last success
	renewFails    atomic.Int64 // lease renewal rounds failed since the last success
	abandoned     atomic.Int64 // handler calls past their timeout, still running
	// startCancelled holds the cause of the cancellation of Start's
	// context before Close: delivery stopped, Publish goes on.
	startCancelled atomic.Pointer[error]
}

// HealthCheck is one check of Health.
type HealthCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
	// Live and Ready say which verdict the check counts for.
	Live  bool `json:"live"`
	Ready bool `json:"ready"`
}

// HealthStatus is an instance's health. Live is false when this instance
// has stopped delivering although it should (its poller has not run for
// two intervals, its completion writes or lease renewals keep failing):
// restarting it is the cure. Ready is false when it cannot write to the
// database (or is not started): send it no traffic. Open circuits and
// stuck handler calls are reported but fail neither: a destination that
// is down is not cured by a restart.
type HealthStatus struct {
	Live   bool          `json:"live"`
	Ready  bool          `json:"ready"`
	Checks []HealthCheck `json:"checks"`
}

// Health runs the checks. It writes to the database (the subscriptions'
// registration, which the engine repeats every PollInterval anyway) to
// prove that the instance can; ctx bounds that write.
func (o *Outbox) Health(ctx context.Context) HealthStatus {
	now := time.Now()
	o.mu.RLock()
	started, closed := o.started, o.closed
	o.mu.RUnlock()
	var checks []HealthCheck
	add := func(name string, ok, live, ready bool, detail string) {
		checks = append(checks, HealthCheck{Name: name, OK: ok, Detail: detail, Live: live, Ready: ready})
	}
	running := started && !closed
	detail := map[bool]string{true: "started", false: "not started, or closed"}[running]
	if cause := o.health.startCancelled.Load(); running && cause != nil {
		running = false
		detail = fmt.Sprintf("stopped: the context given to Start was cancelled (%v) before Close; nothing is delivered while Publish still writes events", *cause)
	}
	add("running", running, true, true, detail)

	if o.cfg.DisablePoller {
		add("poller", true, true, false, "disabled")
	} else if running {
		since := now.Sub(time.Unix(0, o.health.pollBeat.Load()))
		limit := 2*o.cfg.PollMaxInterval + storeTimeout
		add("poller", since <= limit, true, false, fmt.Sprintf("last cycle %v ago (limit %v)", since.Round(time.Millisecond), limit))
	}
	cf := o.health.completeFails.Load()
	add("completion", cf < 3, true, false, fmt.Sprintf("%d completion writes failed since the last success", cf))
	rf := o.health.renewFails.Load()
	add("leases", rf < 2, true, false, fmt.Sprintf("%d lease renewal rounds failed since the last success", rf))
	ab := o.health.abandoned.Load()
	add("handlers", true, false, false, fmt.Sprintf("%d handler calls past their timeout still running", ab))
	var open []string
	for name, st := range o.CircuitStates() {
		if st != CircuitClosed {
			open = append(open, name+" ("+string(st)+")")
		}
	}
	sort.Strings(open)
	add("circuits", true, false, false, fmt.Sprintf("open: %v", open))

	werr := o.reg.sync(ctx)
	detail = "registered the subscriptions"
	if werr != nil {
		detail = werr.Error()
	}
	add("database", werr == nil, false, true, detail)

	hs := HealthStatus{Live: true, Ready: true, Checks: checks}
	for _, c := range checks {
		if !c.OK && c.Live {
			hs.Live = false
		}
		if !c.OK && c.Ready {
			hs.Ready = false
		}
	}
	return hs
}

// LiveHandler serves Health as JSON, with status 200 while the instance
// is live and 503 when it is not: a liveness probe.
func (o *Outbox) LiveHandler() http.Handler {
	return o.healthHandler(func(h HealthStatus) bool { return h.Live })
}

// ReadyHandler is LiveHandler for readiness.
func (o *Outbox) ReadyHandler() http.Handler {
	return o.healthHandler(func(h HealthStatus) bool { return h.Ready })
}

func (o *Outbox) healthHandler(ok func(HealthStatus) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		h := o.Health(ctx)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if !ok(h) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		json.NewEncoder(w).Encode(h)
	})
}

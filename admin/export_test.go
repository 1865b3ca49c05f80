package admin

import (
	"net/http"
	"time"
)

// SetClock makes the login throttle of h read the time from now.
func SetClock(h http.Handler, now func() time.Time) {
	t := h.(*handler).throttle
	t.mu.Lock()
	defer t.mu.Unlock()
	t.now = now
}

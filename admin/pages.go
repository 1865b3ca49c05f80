package admin

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

//go:embed templates/*.html
var templates embed.FS

var pageNames = []string{"index.html", "dead.html", "confirm.html", "event.html", "error.html", "blocked.html", "skip.html", "retire.html", "inbox.html", "inboxentry.html", "inboxconfirm.html", "scheduled.html", "cancel.html", "archive.html"}

var funcs = template.FuncMap{
	// path escapes one path segment of a link: an id or a name with "/",
	// "?" or "#" stays one segment.
	"path": url.PathEscape,
	"seconds": func(s float64) string {
		if s <= 0 {
			return "–"
		}
		return time.Duration(s * float64(time.Second)).Round(time.Millisecond).String()
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000Z")
	},
}

func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(funcs).ParseFS(templates, "templates/layout.html", "templates/"+name)
		if err != nil {
			return nil, fmt.Errorf("admin: parse %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// page is what every page's template gets.
type page struct {
	Title  string
	Base   string
	Who    string
	CSRF   string
	Notice string
	// Inbox is set when the handler has an inbox: the layout links its
	// parked messages.
	Inbox bool
	Data  any
}

// render writes a page; the template runs into a buffer first, so that a
// failing template gives a 500, not half a page.
func (h *handler) render(w http.ResponseWriter, r *http.Request, status int, name, title string, data any) {
	p := page{Title: title, Base: h.base, Who: whoOf(r), CSRF: h.token(whoOf(r)), Notice: h.notice(r), Inbox: h.cfg.Inbox != nil, Data: data}
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", p); err != nil {
		h.log.Error("admin: render "+name, "err", err)
		http.Error(w, "admin: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// redirect sends the browser to path under the base with a notice, after
// a POST (post/redirect/get: a reload does not repeat the action). The
// notice is signed (notice_sig): the page shows only notices the handler
// wrote, for the identity it wrote them for, never a text someone put in
// a link.
func (h *handler) redirect(w http.ResponseWriter, r *http.Request, path string, q url.Values, notice string) {
	if q == nil {
		q = url.Values{}
	}
	q.Set("notice", notice)
	q.Set("notice_sig", h.noticeSig(whoOf(r), notice))
	http.Redirect(w, r, h.base+path+"?"+q.Encode(), http.StatusSeeOther)
}

// noticeSig is the HMAC of a notice for who, under the CSRF key.
func (h *handler) noticeSig(who, notice string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("txoutbox admin notice\x00"))
	m.Write([]byte(who))
	m.Write([]byte{0})
	m.Write([]byte(notice))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// notice returns the request's notice if the handler signed it, or "".
func (h *handler) notice(r *http.Request) string {
	q := r.URL.Query()
	n, sig := q.Get("notice"), q.Get("notice_sig")
	if n == "" || !hmac.Equal([]byte(sig), []byte(h.noticeSig(whoOf(r), n))) {
		return ""
	}
	return n
}

type errorPage struct {
	Status  int
	Message string
}

type indexPage struct {
	Subscriptions []Subscription
	LagError      string
	Stats         *outbox.Stats
	StatsError    string
}

func (h *handler) pageIndex(w http.ResponseWriter, r *http.Request) {
	subs, err := h.subscriptions(r)
	var d indexPage
	d.Subscriptions = subs
	if err != nil {
		d.LagError = err.Error()
	}
	if st, err := h.ob.Stats(r.Context()); err != nil {
		d.StatsError = err.Error()
	} else {
		d.Stats = &st
	}
	h.render(w, r, http.StatusOK, "index.html", "Subscriptions", d)
}

func (h *handler) pagePause(pause bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, status, err := h.setPaused(r, pause)
		if err != nil {
			h.fail(w, r, status, err.Error())
			return
		}
		verb := "Resumed"
		if pause {
			verb = "Paused"
		}
		h.redirect(w, r, "/", nil, verb+" "+name)
	}
}

// filterForm is a dead-letter filter as typed in the form.
type filterForm struct {
	Subscription, Type, Error, Since, Until string
}

func formOf(r *http.Request) filterForm {
	return filterForm{Subscription: r.FormValue("subscription"), Type: r.FormValue("type"), Error: r.FormValue("error"), Since: r.FormValue("since"), Until: r.FormValue("until")}
}

// Query returns the filter as query parameters.
func (f filterForm) Query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"subscription": f.Subscription, "type": f.Type, "error": f.Error, "since": f.Since, "until": f.Until} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

// Empty reports whether the filter selects every dead letter.
func (f filterForm) Empty() bool { return len(f.Query()) == 0 }

type deadPage struct {
	Filter    filterForm
	Letters   []DeadLetter
	Next      string // the URL of the next page, or ""
	CanPurge  bool
	FirstPage string
	Subs      []string
}

// deadPageSize is how many dead letters a page lists.
const deadPageSize = 50

func (h *handler) pageDead(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	f.Limit = deadPageSize
	dls, err := h.ob.Dead(r.Context(), f)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := deadPage{Filter: formOf(r), CanPurge: h.purger != nil}
	for _, dl := range dls {
		d.Letters = append(d.Letters, deadLetter(dl))
	}
	for _, s := range h.ob.Subscriptions() {
		d.Subs = append(d.Subs, s.Name)
	}
	if len(dls) == deadPageSize {
		q := d.Filter.Query()
		q.Set("after", dls[len(dls)-1].ID)
		d.Next = h.base + "/dead?" + q.Encode()
	}
	if f.After != "" {
		d.FirstPage = h.base + "/dead?" + d.Filter.Query().Encode()
	}
	h.render(w, r, http.StatusOK, "dead.html", "Dead letters", d)
}

type confirmPage struct {
	Action string // "replay" or "purge"
	Filter filterForm
	Count  int
}

// pageBulk replays or purges the dead letters the posted filter selects:
// without confirm=1 it counts them (a dry run) and asks to confirm; with
// it, it acts and redirects to the dead letters with the count.
func (h *handler) pageBulk(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f, err := parseFilter(r)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, err.Error())
			return
		}
		confirm := r.PostFormValue("confirm") == "1"
		n, err := h.bulk(r, action, f, !confirm)
		if errors.Is(err, errNoPurge) {
			h.fail(w, r, http.StatusNotImplemented, err.Error())
			return
		}
		if err != nil {
			h.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("%s: %d done, then: %v", action, n, err))
			return
		}
		form := formOf(r)
		if !confirm {
			h.render(w, r, http.StatusOK, "confirm.html", "Confirm "+action, confirmPage{Action: action, Filter: form, Count: n})
			return
		}
		verb := map[string]string{"replay": "Replayed", "purge": "Purged"}[action]
		letters := " dead letters"
		if n == 1 {
			letters = " dead letter"
		}
		h.redirect(w, r, "/dead", form.Query(), verb+" "+strconv.Itoa(n)+letters)
	}
}

func (h *handler) pageLookup(w http.ResponseWriter, r *http.Request) {
	id := r.FormValue("id")
	if id == "" {
		h.fail(w, r, http.StatusBadRequest, "give an event id")
		return
	}
	http.Redirect(w, r, h.base+"/events/"+url.PathEscape(id), http.StatusSeeOther)
}

type eventPage struct {
	Event   Event
	Shown   bool
	Headers string
	Payload string
}

func (h *handler) pageEvent(w http.ResponseWriter, r *http.Request) {
	shown, _ := strconv.ParseBool(r.FormValue("payload"))
	ev, status, err := h.lookup(r, shown)
	if err != nil {
		h.fail(w, r, status, err.Error())
		return
	}
	d := eventPage{Event: ev, Shown: shown}
	if shown {
		d.Headers = indent(ev.Headers)
		switch {
		case ev.PayloadBase64 != nil:
			d.Payload = fmt.Sprintf("(%d bytes, not text) %x", len(ev.PayloadBase64), ev.PayloadBase64)
		default:
			d.Payload = indent(ev.Payload)
		}
	}
	h.render(w, r, http.StatusOK, "event.html", "Event "+ev.ID, d)
}

func indent(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var buf bytes.Buffer
	if json.Indent(&buf, raw, "", "  ") != nil {
		return string(raw)
	}
	return buf.String()
}

type blockedPage struct {
	Keys      []BlockedKey
	Next      string // the URL of the next page, or ""
	FirstPage string
}

func (h *handler) pageBlocked(w http.ResponseWriter, r *http.Request) {
	after, _, err := parsePage(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ks, next, err := h.blocked(r, after, deadPageSize)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err.Error())
		return
	}
	d := blockedPage{Keys: ks}
	if next != "" {
		d.Next = h.base + "/blocked?" + url.Values{"after": {next}}.Encode()
	}
	if after != "" {
		d.FirstPage = h.base + "/blocked"
	}
	h.render(w, r, http.StatusOK, "blocked.html", "Blocked keys", d)
}

type skipPage struct {
	IDs []string
}

// pageSkip skips the posted dead events: without confirm=1 it shows them
// and asks to confirm, changing nothing; with it, it skips them and
// redirects to the blocked keys with the count.
func (h *handler) pageSkip(w http.ResponseWriter, r *http.Request) {
	ids, err := skipIDs(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if r.PostFormValue("confirm") != "1" {
		h.render(w, r, http.StatusOK, "skip.html", "Confirm skip", skipPage{IDs: ids})
		return
	}
	n, err := h.skip(r, ids)
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, fmt.Sprintf("skip: %d done, then: %v", n, err))
		return
	}
	events := " dead events"
	if n == 1 {
		events = " dead event"
	}
	h.redirect(w, r, "/blocked", nil, "Skipped "+strconv.Itoa(n)+events)
}

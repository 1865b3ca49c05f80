package admin

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/inbox"
	"github.com/txoutbox/txoutbox/outbox"
)

// Config configures the admin handler. Authorize is required.
type Config struct {
	// Authorize decides who makes the request: it returns a non-empty name
	// for the audit log, or an error. ErrForbidden (or an error wrapping
	// it) answers 403; any other error, or an empty name, 401. Every
	// request goes through it, the page's assets included. There is no
	// default: New fails without it. Token builds one for a shared secret.
	Authorize func(r *http.Request) (who string, err error)
	// Logger receives the audit log: one record per action (pause,
	// resume, replay and its dry run, purge, skip, payload shown), at
	// LevelAudit, and one per refused or throttled request, at WARN, with
	// who, what and the outcome. Defaults to slog.Default().
	Logger *slog.Logger
	// BasePath is where the handler is mounted, without a trailing slash:
	// "/admin" serves /admin/ and /admin/api/…. Mount the handler at
	// BasePath+"/" without http.StripPrefix. Defaults to "" (the root).
	BasePath string
	// Store is the outbox's store, for purging dead letters: purge is
	// offered when it implements Purger (*sqlstore.Store does), and
	// answers 501 otherwise. Optional.
	Store any
	// CSRFKey is the secret the CSRF tokens are derived from. Instances
	// behind one load balancer must share it; defaults to a random key per
	// process (a restart makes open pages reload before their next POST).
	CSRFKey []byte
	// Inbox, if set, adds the parked messages of package inbox to the
	// API (list, replay, purge). Optional.
	Inbox *inbox.Inbox
	// InboxHandlers are the handlers replay runs, by inbox consumer name
	// (the page runs in the service, so it has them); replay of a
	// consumer without one answers 501.
	InboxHandlers map[string]inbox.Handler
	// Realm, if set, makes a 401 carry a WWW-Authenticate: Basic challenge
	// with it, so that a browser asks for a user name and password (see
	// Token).
	Realm string
	// LoginBurst and LoginEvery throttle failed authorizations per client
	// address: an address may fail LoginBurst times in a row (default
	// 10), then once per LoginEvery (default 2s); past that, its requests
	// are answered 429 with Retry-After, without calling Authorize, until
	// it may try again. A successful request costs nothing. A negative
	// LoginBurst turns the throttle off.
	LoginBurst int
	LoginEvery time.Duration
	// ClientAddr names the client of a request for the throttle. Defaults
	// to the host of r.RemoteAddr. Behind a reverse proxy every client has
	// the proxy's address, and one client's failures throttle all of them:
	// return the address your proxy reports (X-Forwarded-For as your proxy
	// sets it, never as the client sent it).
	ClientAddr func(r *http.Request) string
}

// LevelAudit is the level of the audit records: above every standard
// level (slog.LevelError+4), so that a handler set to WARN or ERROR to
// quieten the application's logs does not drop the record of a purge by
// accident. Text and JSON handlers print it as "ERROR+4"; name it with
// HandlerOptions.ReplaceAttr, and route the records on msg="admin: audit"
// (or give Config.Logger a logger of their own) if your alerting treats
// ERROR and above as failures.
const LevelAudit = slog.LevelError + 4

// Purger deletes the given dead letters (as Outbox.Dead lists them) and
// returns how many it deleted. *sqlstore.Store implements it.
type Purger interface {
	PurgeLetters(ctx context.Context, dls []outbox.DeadLetter) (int, error)
}

// ErrForbidden is what an Authorize returns (or wraps) for a caller it
// knows but does not allow: the answer is 403 instead of 401.
var ErrForbidden = errors.New("admin: forbidden")

// csrfField is the form field, and csrfHeader the header, that carry the
// CSRF token of a POST.
const (
	csrfField  = "csrf_token"
	csrfHeader = "X-CSRF-Token"
)

// maxBody bounds the body of a POST.
const maxBody = 64 << 10

type handler struct {
	ob     *outbox.Outbox
	cfg    Config
	log    *slog.Logger
	base   string
	key    []byte
	purger Purger
	cop    *http.CrossOriginProtection
	mux    *http.ServeMux
	pages  map[string]*template.Template
	// throttle limits failed logins per client address; nil: off.
	throttle   *throttle
	clientAddr func(*http.Request) string
}

type whoKey struct{}

// New returns the admin handler of ob: the HTML pages at BasePath+"/" and
// the JSON API at BasePath+"/api/". It fails without cfg.Authorize.
func New(ob *outbox.Outbox, cfg Config) (http.Handler, error) {
	if ob == nil {
		return nil, errors.New("admin: New: nil *outbox.Outbox")
	}
	if cfg.Authorize == nil {
		return nil, errors.New("admin: New: Config.Authorize is required (admin has no default that lets everyone in; see admin.Token)")
	}
	base := strings.TrimRight(cfg.BasePath, "/")
	if base != "" && !strings.HasPrefix(base, "/") {
		return nil, fmt.Errorf("admin: New: BasePath %q must start with /", cfg.BasePath)
	}
	h := &handler{ob: ob, cfg: cfg, log: cfg.Logger, base: base, key: cfg.CSRFKey, cop: http.NewCrossOriginProtection()}
	if h.log == nil {
		h.log = slog.Default()
	}
	if len(h.key) == 0 {
		h.key = make([]byte, 32)
		rand.Read(h.key)
	}
	if p, ok := cfg.Store.(Purger); ok {
		h.purger = p
	}
	h.throttle = newThrottle(cfg.LoginBurst, cfg.LoginEvery)
	h.clientAddr = cfg.ClientAddr
	if h.clientAddr == nil {
		h.clientAddr = remoteHost
	}
	var err error
	if h.pages, err = parsePages(); err != nil {
		return nil, err
	}
	h.routes()
	return h, nil
}

// ServeHTTP authorizes every request, then checks a POST's origin and
// CSRF token, then routes it.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Referrer-Policy", "same-origin")
	who, throttled, err := h.authorize(w, r)
	if throttled {
		return
	}
	if err != nil || who == "" {
		status := http.StatusUnauthorized
		if errors.Is(err, ErrForbidden) {
			status = http.StatusForbidden
		} else if h.cfg.Realm != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="`+strings.ReplaceAll(h.cfg.Realm, `"`, "'")+`", charset="UTF-8"`)
		}
		reason := "no identity"
		if err != nil {
			reason = err.Error()
		}
		h.log.LogAttrs(r.Context(), slog.LevelWarn, "admin: request denied", slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("remote", r.RemoteAddr), slog.Int("status", status), slog.String("reason", reason))
		h.fail(w, r, status, http.StatusText(status))
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), whoKey{}, who))
	w.Header().Set(csrfHeader, h.token(who))
	switch r.Method {
	case http.MethodGet, http.MethodHead:
	case http.MethodPost:
		if err := h.cop.Check(r); err != nil {
			h.reject(w, r, http.StatusForbidden, "cross-origin request rejected")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		if !h.validToken(r, who) {
			h.reject(w, r, http.StatusForbidden, "missing or invalid CSRF token (reload the page)")
			return
		}
	default:
		w.Header().Set("Allow", "GET, HEAD, POST")
		h.fail(w, r, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// authorize runs Config.Authorize under the login throttle: a request
// from an address out of tries is answered 429 here (ok false), without
// calling Authorize; a successful one gives its try back.
func (h *handler) authorize(w http.ResponseWriter, r *http.Request) (who string, throttled bool, err error) {
	if h.throttle == nil {
		who, err = h.cfg.Authorize(r)
		return who, false, err
	}
	addr := h.clientAddr(r)
	if wait, first := h.throttle.take(addr); wait > 0 {
		secs := int((wait + time.Second - 1) / time.Second)
		if first {
			h.log.LogAttrs(r.Context(), slog.LevelWarn, "admin: login throttled", slog.String("client", addr), slog.String("remote", r.RemoteAddr),
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Int("retry_after_seconds", secs))
		}
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		h.fail(w, r, http.StatusTooManyRequests, "too many failed logins from this address: try again in "+strconv.Itoa(secs)+"s")
		return "", true, nil
	}
	who, err = h.cfg.Authorize(r)
	if err == nil && who != "" || errors.Is(err, ErrForbidden) {
		// Known callers (allowed or forbidden) spend no try.
		h.throttle.refund(addr)
	}
	return who, false, err
}

// reject answers an authorized request that failed a check, and writes it
// to the audit log.
func (h *handler) reject(w http.ResponseWriter, r *http.Request, status int, why string) {
	h.log.LogAttrs(r.Context(), slog.LevelWarn, "admin: request rejected", slog.String("who", whoOf(r)), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("remote", r.RemoteAddr),
		slog.String("origin", r.Header.Get("Origin")), slog.String("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")), slog.Int("status", status), slog.String("reason", why))
	h.fail(w, r, status, why)
}

func whoOf(r *http.Request) string {
	who, _ := r.Context().Value(whoKey{}).(string)
	return who
}

// token is the CSRF token of who: an HMAC of the identity, so that a page
// rendered for one caller is no use for another, and a cross-site page,
// which cannot read ours, cannot know it.
func (h *handler) token(who string) string {
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte("txoutbox admin csrf\x00"))
	m.Write([]byte(who))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func (h *handler) validToken(r *http.Request, who string) bool {
	got := r.Header.Get(csrfHeader)
	if got == "" {
		got = r.PostFormValue(csrfField)
	}
	want := h.token(who)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// audit writes an action to the audit log, at LevelAudit whatever its
// outcome: a failed action has an error attribute.
func (h *handler) audit(r *http.Request, action string, err error, attrs ...slog.Attr) {
	all := append([]slog.Attr{slog.String("who", whoOf(r)), slog.String("action", action), slog.String("remote", r.RemoteAddr)}, attrs...)
	if err != nil {
		all = append(all, slog.String("error", err.Error()))
	}
	h.log.LogAttrs(r.Context(), LevelAudit, "admin: audit", all...)
}

// fail answers an error as JSON under /api/ and as text elsewhere.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if h.isAPI(r) {
		writeJSON(w, status, map[string]string{"error": msg})
		return
	}
	if h.pages != nil && status != http.StatusUnauthorized && whoOf(r) != "" {
		h.render(w, r, status, "error.html", "Error", errorPage{Status: status, Message: msg})
		return
	}
	http.Error(w, msg, status)
}

func (h *handler) isAPI(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, h.base+"/api/")
}

// Token returns an Authorize that accepts the shared secret token, as
// "Authorization: Bearer <token>" or as the password of HTTP Basic
// authentication, so that a browser can log in when Config.Realm is set.
// Who is "token" either way: a Basic user name is not verified (anyone
// with the token may type any), so it is not taken as an identity for the
// audit log. To tell operators apart, give each a credential of their own
// in an Authorize of yours (SSO, mTLS, per-user tokens). The comparison
// runs in constant time. An empty token is refused: New would then
// accept nobody, and Token panics instead.
func Token(token string) func(*http.Request) (string, error) {
	if token == "" {
		panic("admin: Token: empty token")
	}
	want := sha256.Sum256([]byte(token))
	match := func(s string) bool {
		got := sha256.Sum256([]byte(s))
		return subtle.ConstantTimeCompare(got[:], want[:]) == 1
	}
	return func(r *http.Request) (string, error) {
		if _, pass, ok := r.BasicAuth(); ok {
			if match(pass) {
				return "token", nil
			}
			return "", errors.New("wrong password")
		}
		auth := r.Header.Get("Authorization")
		if t, ok := strings.CutPrefix(auth, "Bearer "); ok {
			if match(t) {
				return "token", nil
			}
			return "", errors.New("wrong bearer token")
		}
		return "", errors.New("no credentials")
	}
}

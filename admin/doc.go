// Package admin is the operator's web interface to an outbox: an
// http.Handler with a JSON API and a small server-rendered page
// (html/template, no JavaScript), built on the Outbox's operator API.
//
// It shows the subscriptions with their state, lag and circuit, and
// pauses and resumes them; lists dead letters by filter, replays them
// (a dry run counts them first, then the operator confirms) and purges
// them; lists the ordering keys a dead event blocks (Ordered
// subscriptions) and skips such an event (after a confirmation on the
// page); and looks an event up by id, with each subscription's delivery
// state and its last failed attempts. With Config.Inbox it lists the
// parked messages of package inbox, shows one, and replays or purges it
// after a confirmation. Payloads are shown only on request.
//
// Security: every request, pages and API alike, goes through
// Config.Authorize, which the application supplies (there is no default;
// Token is a ready one for a shared secret). Every state-changing request
// is a POST that must carry the CSRF token (the hidden field csrf_token,
// or the X-CSRF-Token header, whose value every authorized response
// carries and GET /api/csrf returns) and must not come from another site
// (http.CrossOriginProtection: Sec-Fetch-Site and Origin); otherwise it is
// answered 403. Every action, and every refused request, is written to
// the audit log (Config.Logger) with who did what; actions at LevelAudit,
// above ERROR, so that a logger's level cannot drop them by accident.
// Failed logins are throttled per client address (Config.LoginBurst,
// LoginEvery): 429 with Retry-After.
//
// Mount it under its BasePath:
//
//	h, err := admin.New(ob, admin.Config{
//		Authorize: admin.Token(os.Getenv("ADMIN_TOKEN")),
//		Realm:     "outbox admin",
//		BasePath:  "/admin",
//		Store:     store, // *sqlstore.Store: enables purge
//	})
//	mux.Handle("/admin/", h)
//
// The JSON API, under BasePath+"/api":
//
//	GET  /api/csrf                          {"token": …} for the X-CSRF-Token header
//	GET  /api/subscriptions                 state, circuit, lag
//	POST /api/subscriptions/{name}/pause
//	POST /api/subscriptions/{name}/resume
//	GET  /api/stats                         counts by status; dead: the dead letters
//	GET  /api/dead?subscription=&type=&error=&since=&until=&after=&limit=
//	POST /api/dead/replay?…&dry_run=1       {"count": n}; without dry_run, replays (no filter: all=true)
//	POST /api/dead/purge?…&dry_run=1        501 without a Purger (no filter: all=true)
//	POST /api/dead/skip?id=…[&id=…]         {"count": n}: gives up on dead events for good (Outbox.SkipDead)
//	GET  /api/blocked?after=&limit=         ordering keys blocked by a dead event (Outbox.BlockedKeys)
//	GET  /api/events/{id}[?payload=1]       the event and its deliveries
//	GET  /api/inbox?consumer=&after_consumer=&after_id=&limit=   parked inbox messages, without payloads
//	POST /api/inbox/replay?consumer=&id=    with the consumer's handler from Config.InboxHandlers
//	POST /api/inbox/purge?consumer=&id=…
package admin

package admin

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/txoutbox/txoutbox/outbox"
)

// ArchivedEvent is a delivered event kept in the archive (sqlstore's
// Options.ArchiveDelivered), as the API shows it (outbox.ArchivedEvent):
// never its payload (the event's page shows it on request).
type ArchivedEvent struct {
	ID            string    `json:"id"`
	Type          string    `json:"type"`
	AggregateType string    `json:"aggregate_type,omitempty"`
	AggregateID   string    `json:"aggregate_id,omitempty"`
	TenantID      string    `json:"tenant_id,omitempty"`
	OrderingKey   string    `json:"ordering_key,omitempty"`
	Attempts      int       `json:"attempts"`
	CreatedAt     time.Time `json:"created_at"`
	DeliveredAt   time.Time `json:"delivered_at"`
	DeliveredBy   string    `json:"delivered_by"`
}

// archiveSearch is the search the archive's page and API take from the
// request: id, type and aggregate ("TYPE/ID", or "TYPE" for every
// aggregate of the type), and the page (after, limit).
type archiveSearch struct {
	ID, Type, Aggregate string
}

func (q archiveSearch) query(after string, limit int) outbox.ArchiveQuery {
	aq := outbox.ArchiveQuery{ID: q.ID, Type: q.Type, After: after, Limit: limit}
	aq.AggregateType, aq.AggregateID, _ = strings.Cut(q.Aggregate, "/")
	return aq
}

func (q archiveSearch) values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"id": q.ID, "type": q.Type, "aggregate": q.Aggregate} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v
}

func searchOf(r *http.Request) archiveSearch {
	return archiveSearch{ID: strings.TrimSpace(r.FormValue("id")), Type: strings.TrimSpace(r.FormValue("type")), Aggregate: strings.TrimSpace(r.FormValue("aggregate"))}
}

// archived returns a page of the archived events q selects after the id
// after, and the after of the next page ("" on the last one).
func (h *handler) archived(r *http.Request, q archiveSearch, after string, limit int) ([]ArchivedEvent, string, error) {
	es, err := h.ob.SearchArchive(r.Context(), q.query(after, limit))
	if err != nil {
		return nil, "", err
	}
	v := []ArchivedEvent{}
	for _, e := range es {
		v = append(v, ArchivedEvent{ID: e.ID, Type: e.Type, AggregateType: e.AggregateType, AggregateID: e.AggregateID, TenantID: e.TenantID,
			OrderingKey: e.OrderingKey, Attempts: e.Attempts, CreatedAt: e.CreatedAt, DeliveredAt: e.DeliveredAt, DeliveredBy: e.DeliveredBy})
	}
	next := ""
	if len(es) >= limit {
		next = es[len(es)-1].ID
	}
	return v, next, nil
}

// errNoAggregateType says what an aggregate search lacks.
var errNoAggregateType = errors.New("aggregate: give TYPE/ID, or TYPE alone")

func (h *handler) apiArchive(w http.ResponseWriter, r *http.Request) {
	after, limit, err := parsePage(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	q := searchOf(r)
	if strings.HasPrefix(q.Aggregate, "/") {
		h.fail(w, r, http.StatusBadRequest, errNoAggregateType.Error())
		return
	}
	es, next, err := h.archived(r, q, after, cmpOr(limit, 100))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Events []ArchivedEvent `json:"events"`
		// Next is the after of the next page, or "" on the last one.
		Next string `json:"next,omitempty"`
	}{es, next})
}

type archivePage struct {
	ID, Type, Aggregate string
	Events              []ArchivedEvent
	Next, FirstPage     string
}

// pageArchive is the archive's search form and a page of what it found
// (the whole archive, in id order, without a search).
func (h *handler) pageArchive(w http.ResponseWriter, r *http.Request) {
	after, _, err := parsePage(r)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	q := searchOf(r)
	if strings.HasPrefix(q.Aggregate, "/") {
		h.fail(w, r, http.StatusBadRequest, errNoAggregateType.Error())
		return
	}
	es, next, err := h.archived(r, q, after, deadPageSize)
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	d := archivePage{ID: q.ID, Type: q.Type, Aggregate: q.Aggregate, Events: es}
	if next != "" {
		v := q.values()
		v.Set("after", next)
		d.Next = h.base + "/archive?" + v.Encode()
	}
	if after != "" {
		d.FirstPage = h.base + "/archive"
		if v := q.values(); len(v) > 0 {
			d.FirstPage += "?" + v.Encode()
		}
	}
	h.render(w, r, http.StatusOK, "archive.html", "Archive", d)
}

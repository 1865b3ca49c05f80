package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// The events the orders service publishes, and the aggregate they are about.
const (
	OrderPlaced    outbox.EventType     = "OrderPlaced"
	OrderCancelled outbox.EventType     = "OrderCancelled"
	OrderAggregate outbox.AggregateType = "order"
)

// Order statuses.
const (
	StatusPlaced    = "placed"
	StatusCancelled = "cancelled"
)

// Limits of a valid order.
const (
	maxBodyBytes    = 64 << 10
	maxCustomerLen  = 100
	maxItems        = 100
	maxSKULen       = 64
	maxQty          = 1000
	maxPriceCents   = 100_000_000
	defaultPageSize = 50
)

// Item is one line of an order.
type Item struct {
	SKU        string `json:"sku"`
	Qty        int64  `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

// Order is the aggregate, as stored and as served.
type Order struct {
	ID          int64      `json:"id"`
	Customer    string     `json:"customer"`
	Items       []Item     `json:"items"`
	TotalCents  int64      `json:"total_cents"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"created_at"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
}

// newOrder is the body of POST /orders.
type newOrder struct {
	Customer string `json:"customer"`
	Items    []Item `json:"items"`
}

// validate returns every rule the order breaks, joined in one message, or "".
func (o *newOrder) validate() string {
	var probs []string
	o.Customer = strings.TrimSpace(o.Customer)
	switch n := utf8.RuneCountInString(o.Customer); {
	case n == 0:
		probs = append(probs, "customer is required")
	case n > maxCustomerLen:
		probs = append(probs, fmt.Sprintf("customer is %d characters; the limit is %d", n, maxCustomerLen))
	}
	switch n := len(o.Items); {
	case n == 0:
		probs = append(probs, "items: at least one item is required")
	case n > maxItems:
		probs = append(probs, fmt.Sprintf("items: %d items; the limit is %d", n, maxItems))
	}
	for i, it := range o.Items {
		if it.SKU == "" || len(it.SKU) > maxSKULen {
			probs = append(probs, fmt.Sprintf("items[%d].sku must be 1 to %d bytes", i, maxSKULen))
		}
		if it.Qty < 1 || it.Qty > maxQty {
			probs = append(probs, fmt.Sprintf("items[%d].qty must be between 1 and %d", i, maxQty))
		}
		if it.PriceCents < 0 || it.PriceCents > maxPriceCents {
			probs = append(probs, fmt.Sprintf("items[%d].price_cents must be between 0 and %d", i, maxPriceCents))
		}
	}
	return strings.Join(probs, "; ")
}

// decodeBody reads one JSON document of at most maxBodyBytes into v,
// rejecting unknown fields and trailing data. Its error is fit for the
// client: it names the problem, not the body's content beyond a field name.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if dec.More() || dec.Decode(&struct{}{}) != io.EOF {
			return errors.New("body must be a single JSON object")
		}
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var big *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return errors.New(`body is empty; send a JSON object such as {"customer":"ada","items":[{"sku":"book","qty":1,"price_cents":1250}]}`)
	case errors.As(err, &syn), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("body is not valid JSON")
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Errorf("body must be a JSON object, not %s", typ.Value)
		}
		return fmt.Errorf("%s must be %s, not a JSON %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value)
	case errors.As(err, &big):
		return fmt.Errorf("body is over %d bytes", big.Limit)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return errors.New("body cannot be read as an order")
}

func jsonKind(goKind string) string {
	switch {
	case strings.HasPrefix(goKind, "int"), strings.HasPrefix(goKind, "uint"), strings.HasPrefix(goKind, "float"):
		return "a number"
	case goKind == "string":
		return "a string"
	case goKind == "slice":
		return "an array"
	case goKind == "struct", goKind == "map":
		return "an object"
	}
	return goKind
}

// --- storage ---

// orderRow is an orders row; items are kept as a JSON document.
type orderRow struct {
	ID          int64        `db:"id"`
	Customer    string       `db:"customer"`
	Items       string       `db:"items"`
	TotalCents  int64        `db:"total_cents"`
	Status      string       `db:"status"`
	CreatedAt   time.Time    `db:"created_at"`
	CancelledAt sql.NullTime `db:"cancelled_at"`
}

func (r *orderRow) order() (Order, error) {
	o := Order{ID: r.ID, Customer: r.Customer, TotalCents: r.TotalCents, Status: r.Status, CreatedAt: r.CreatedAt.UTC()}
	if err := json.Unmarshal([]byte(r.Items), &o.Items); err != nil {
		return Order{}, fmt.Errorf("restapi: order %d: stored items are not valid JSON", r.ID)
	}
	if r.CancelledAt.Valid {
		t := r.CancelledAt.Time.UTC()
		o.CancelledAt = &t
	}
	return o, nil
}

// orders is the repository of the orders table. Table names come from the
// program, never from requests.
type orders struct {
	table   string // quoted
	dialect string // "sqlite", "mysql" or "postgres"
	bind    int    // sqlx bind type: ? or $1
	cols    string
}

func newOrders(db database, table string) *orders {
	q := `"` + table + `"`
	if db.dialect == "mysql" {
		q = "`" + table + "`"
	}
	return &orders{table: q, dialect: db.dialect, bind: sqlx.BindType(db.driver),
		cols: "id, customer, items, total_cents, status, created_at, cancelled_at"}
}

// sql rebinds a query written with ? placeholders for the database.
func (s *orders) sql(q string) string { return sqlx.Rebind(s.bind, q) }

// schema is the orders table per dialect; migrate applies it at start.
var schema = map[string]string{
	"sqlite": `CREATE TABLE IF NOT EXISTS %s (
	id           INTEGER PRIMARY KEY AUTOINCREMENT,
	customer     TEXT     NOT NULL,
	items        TEXT     NOT NULL,
	total_cents  INTEGER  NOT NULL,
	status       TEXT     NOT NULL,
	created_at   DATETIME NOT NULL,
	cancelled_at DATETIME NULL
)`,
	"mysql": `CREATE TABLE IF NOT EXISTS %s (
	id           BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
	customer     VARCHAR(100) NOT NULL,
	items        TEXT         NOT NULL,
	total_cents  BIGINT       NOT NULL,
	status       VARCHAR(16)  NOT NULL,
	created_at   DATETIME(6)  NOT NULL,
	cancelled_at DATETIME(6)  NULL
)`,
	"postgres": `CREATE TABLE IF NOT EXISTS %s (
	id           BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
	customer     VARCHAR(100) NOT NULL,
	items        TEXT         NOT NULL,
	total_cents  BIGINT       NOT NULL,
	status       VARCHAR(16)  NOT NULL,
	created_at   TIMESTAMPTZ  NOT NULL,
	cancelled_at TIMESTAMPTZ  NULL
)`,
}

func (s *orders) migrate(ctx context.Context, db *sqlx.DB) error {
	if _, err := db.ExecContext(ctx, fmt.Sprintf(schema[s.dialect], s.table)); err != nil {
		return fmt.Errorf("restapi: create table %s: %w", s.table, err)
	}
	return nil
}

func (s *orders) insert(ctx context.Context, tx *sqlx.Tx, o *Order) error {
	items, err := json.Marshal(o.Items)
	if err != nil {
		return err
	}
	args := []any{o.Customer, string(items), o.TotalCents, o.Status, o.CreatedAt}
	q := s.sql(`INSERT INTO ` + s.table + ` (customer, items, total_cents, status, created_at) VALUES (?, ?, ?, ?, ?)`)
	if s.dialect == "mysql" { // MySQL has no RETURNING
		res, err := tx.ExecContext(ctx, q, args...)
		if err != nil {
			return err
		}
		o.ID, err = res.LastInsertId()
		return err
	}
	return tx.QueryRowxContext(ctx, q+` RETURNING id`, args...).Scan(&o.ID)
}

func (s *orders) get(ctx context.Context, q sqlx.QueryerContext, id int64) (Order, error) {
	var r orderRow
	err := sqlx.GetContext(ctx, q, &r, s.sql(`SELECT `+s.cols+` FROM `+s.table+` WHERE id = ?`), id)
	if err != nil {
		return Order{}, err
	}
	return r.order()
}

// list returns up to limit orders with ids greater than after, by id.
func (s *orders) list(ctx context.Context, q sqlx.QueryerContext, after int64, limit int) ([]Order, error) {
	var rows []orderRow
	err := sqlx.SelectContext(ctx, q, &rows, s.sql(`SELECT `+s.cols+` FROM `+s.table+` WHERE id > ? ORDER BY id LIMIT ?`), after, limit)
	if err != nil {
		return nil, err
	}
	out := make([]Order, 0, len(rows))
	for i := range rows {
		o, err := rows[i].order()
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

// cancel sets a placed order to cancelled and reports whether it did.
func (s *orders) cancel(ctx context.Context, tx *sqlx.Tx, id int64, at time.Time) (bool, error) {
	res, err := tx.ExecContext(ctx, s.sql(`UPDATE `+s.table+` SET status = ?, cancelled_at = ? WHERE id = ? AND status = ?`),
		StatusCancelled, at, id, StatusPlaced)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// --- handlers ---

// orderPlaced and orderCancelled are the events' payloads.
type orderPlaced struct {
	OrderID    int64  `json:"order_id"`
	Customer   string `json:"customer"`
	Items      []Item `json:"items"`
	TotalCents int64  `json:"total_cents"`
}

type orderCancelled struct {
	OrderID    int64 `json:"order_id"`
	TotalCents int64 `json:"total_cents"`
}

func (a *app) routes(r chi.Router) {
	// One transaction per POST; GETs read without one. The middleware
	// commits on a 2xx and only then hands the published events to the
	// outbox; any other status rolls the order and its events back.
	r.Use(txmw.Transactional(a.db, middleware.WithOutbox(a.ob)))
	r.Post("/", a.createOrder)
	r.Get("/", a.listOrders)
	r.Get("/{id}", a.getOrder)
	r.Post("/{id}/cancel", a.cancelOrder)
}

func (a *app) createOrder(w http.ResponseWriter, r *http.Request) {
	var in newOrder
	if err := decodeBody(w, r, &in); err != nil {
		problem(w, http.StatusBadRequest, err.Error())
		return
	}
	if msg := in.validate(); msg != "" {
		problem(w, http.StatusBadRequest, msg)
		return
	}
	o := Order{Customer: in.Customer, Items: in.Items, Status: StatusPlaced, CreatedAt: a.now()}
	for _, it := range o.Items {
		o.TotalCents += it.Qty * it.PriceCents
	}
	ctx := r.Context()
	if err := a.orders.insert(ctx, txmw.Tx(ctx), &o); err != nil {
		a.internal(w, r, "insert order", err)
		return
	}
	if err := a.publish(ctx, OrderPlaced, o.ID, orderPlaced{OrderID: o.ID, Customer: o.Customer, Items: o.Items, TotalCents: o.TotalCents}); err != nil {
		a.internal(w, r, "publish OrderPlaced", err)
		return
	}
	w.Header().Set("Location", "/orders/"+strconv.FormatInt(o.ID, 10))
	writeJSON(w, http.StatusCreated, o)
}

func (a *app) getOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	o, err := a.orders.get(r.Context(), a.db, id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		problem(w, http.StatusNotFound, fmt.Sprintf("order %d not found", id))
	case err != nil:
		a.internal(w, r, "get order", err)
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

// orderPage is the body of GET /orders.
type orderPage struct {
	Orders []Order `json:"orders"`
	// Next is the URL of the next page, if there may be one.
	Next string `json:"next,omitempty"`
}

func (a *app) listOrders(w http.ResponseWriter, r *http.Request) {
	after, limit := int64(0), defaultPageSize
	if v := r.URL.Query().Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			problem(w, http.StatusBadRequest, "after must be an order id")
			return
		}
		after = n
	}
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			problem(w, http.StatusBadRequest, "limit must be between 1 and 500")
			return
		}
		limit = n
	}
	list, err := a.orders.list(r.Context(), a.db, after, limit)
	if err != nil {
		a.internal(w, r, "list orders", err)
		return
	}
	page := orderPage{Orders: list}
	if len(list) == limit {
		page.Next = fmt.Sprintf("/orders?after=%d&limit=%d", list[len(list)-1].ID, limit)
	}
	writeJSON(w, http.StatusOK, page)
}

func (a *app) cancelOrder(w http.ResponseWriter, r *http.Request) {
	id, ok := orderID(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	tx := txmw.Tx(ctx)
	changed, err := a.orders.cancel(ctx, tx, id, a.now())
	if err != nil {
		a.internal(w, r, "cancel order", err)
		return
	}
	o, err := a.orders.get(ctx, tx, id)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		problem(w, http.StatusNotFound, fmt.Sprintf("order %d not found", id))
		return
	case err != nil:
		a.internal(w, r, "read cancelled order", err)
		return
	case !changed:
		// Nothing changed and nothing is published; the non-2xx status
		// rolls the transaction back.
		problem(w, http.StatusConflict, fmt.Sprintf("order %d is already %s", id, o.Status))
		return
	}
	if err := a.publish(ctx, OrderCancelled, id, orderCancelled{OrderID: id, TotalCents: o.TotalCents}); err != nil {
		a.internal(w, r, "publish OrderCancelled", err)
		return
	}
	writeJSON(w, http.StatusOK, o)
}

// publish writes an event about order id through the request's
// transaction.
func (a *app) publish(ctx context.Context, t outbox.EventType, id int64, payload any) error {
	b, err := json.Marshal(payload)
	if err != nil {
		return err
	}
	_, err = outbox.Publish(ctx, outbox.Envelope{
		Type:          t,
		AggregateType: OrderAggregate,
		AggregateID:   strconv.FormatInt(id, 10),
		JSON:          b,
	})
	return err
}

func orderID(w http.ResponseWriter, r *http.Request) (int64, bool) {
	s := chi.URLParam(r, "id")
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		problem(w, http.StatusNotFound, fmt.Sprintf("order %q not found: ids are positive numbers", s))
		return 0, false
	}
	return id, true
}

package outboxtest_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/outboxtest"
)

// placeOrderHandler is an HTTP handler under test: it publishes through
// the request's transaction and fails on an empty body.
func placeOrderHandler(w http.ResponseWriter, r *http.Request) {
	order := r.FormValue("order")
	if order == "" {
		http.Error(w, "no order", http.StatusUnprocessableEntity) // rolls back
		return
	}
	body, err := json.Marshal(map[string]string{"order": order})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	if _, err := outbox.Publish(r.Context(), outbox.Envelope{Type: OrderPlaced, JSON: body}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
}

// A handler test with httptest: the request middleware (package
// middleware, which txmw binds to *sql.DB) begins its transactions on the
// in-memory store instead. A committed request's event is delivered; a
// rolled-back request published nothing.
func Example_httpHandler() {
	ctx := context.Background()
	st := outboxtest.NewStore()
	ob := newOutbox(st, outbox.Config{})
	rec := outboxtest.Record(ob, "test", OrderPlaced)
	if err := ob.Start(ctx); err != nil {
		panic(err)
	}
	defer ob.Close(ctx)

	begin := func(ctx context.Context, _ *sql.TxOptions) (middleware.Unit, error) { return st.Begin(ctx), nil }
	h := middleware.New(begin, middleware.WithOutbox(ob)).Handler(http.HandlerFunc(placeOrderHandler))

	for _, target := range []string{"/orders?order=42", "/orders"} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, target, nil))
		fmt.Println("POST", target, w.Code)
	}
	if err := st.Drain(ctx, ob); err != nil {
		panic(err)
	}
	for _, ev := range rec.Events() {
		fmt.Println("delivered:", ev.Type, string(ev.JSON))
	}
	// Output:
	// POST /orders?order=42 201
	// POST /orders 422
	// delivered: OrderPlaced {"order":"42"}
}

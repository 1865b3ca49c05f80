package e2e_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// TestSlowClientsHoldNoConnection: with a pool of 4, four clients that
// are still sending their bodies to a handler that reads the body and
// then writes and publishes hold no connection, so a fifth, normal POST
// succeeds meanwhile (issue 37, item 1: it got 503 after the begin
// timeout when the transaction began before the handler). The slow
// clients are held mid-body by the test, and finish afterwards.
func TestSlowClientsHoldNoConnection(t *testing.T) {
	const slow = 4
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, name, outbox.Config{})
			f.db.SetMaxOpenConns(slow)
			reading := make(chan struct{}, slow)
			r := f.router()
			r.Post("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
				id := chi.URLParam(r, "id")
				if strings.HasPrefix(id, "slow") {
					reading <- struct{}{}
				}
				if _, err := io.ReadAll(r.Body); err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				if err := createRebound(r, f, id); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			e, srv := serve(t, r)

			conns := make([]net.Conn, slow)
			for i := range conns {
				c, err := net.Dial("tcp", srv.Listener.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				// Headers and the first byte of a two-byte body.
				fmt.Fprintf(c, "POST /items/slow%d HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{", i)
				conns[i] = c
			}
			for i := range slow {
				select {
				case <-reading:
				case <-time.After(guard):
					t.Fatalf("%d of %d slow requests reached the handler within %v", i, slow, guard)
				}
			}

			// Every slow client is mid-body: the handlers wait in ReadAll.
			e.POST("/items/fast").WithBytes([]byte(`{}`)).Expect().Status(http.StatusCreated)
			if rows(t, f, f.items, "id", "fast") != 1 || rows(t, f, f.store.Table(), "aggregate_id", "fast") != 1 {
				t.Error("the fast request's row or event is missing")
			}

			for i, c := range conns {
				if _, err := io.WriteString(c, "}"); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(guard))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				if err != nil {
					t.Fatalf("slow client %d: %v", i, err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					t.Errorf("slow client %d: %s, want 201", i, resp.Status)
				}
				if rows(t, f, f.store.Table(), "aggregate_id", fmt.Sprintf("slow%d", i)) != 1 {
					t.Errorf("slow client %d: no event", i)
				}
			}
		})
	}
}

// createRebound is fixture.create with the placeholders of f's database
// (the fixture's own helpers use ?, which PostgreSQL refuses).
func createRebound(r *http.Request, f *fixture, id string) error {
	ctx := r.Context()
	tx := txmw.Tx(ctx)
	if _, err := tx.ExecContext(ctx, tx.Rebind("INSERT INTO "+f.items+" (id) VALUES (?)"), id); err != nil {
		return err
	}
	_, err := outbox.Publish(ctx, outbox.Envelope{
		Type: itemCreated, AggregateType: "item", AggregateID: id,
		JSON: []byte(fmt.Sprintf(`{"id":%q}`, id)),
	})
	return err
}

func rows(t *testing.T, f *fixture, table, col, id string) int {
	t.Helper()
	var n int
	if err := f.db.Get(&n, f.db.Rebind("SELECT COUNT(*) FROM "+table+" WHERE "+col+" = ?"), id); err != nil {
		t.Fatalf("count %s: %v", table, err)
	}
	return n
}

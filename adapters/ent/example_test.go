package entoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"entgo.io/ent/dialect"
	entsql "entgo.io/ent/dialect/sql"
	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite" // driver "sqlite"

	entoutbox "github.com/txoutbox/txoutbox/adapters/ent"
	// Stands for your generated package, built with --feature sql/execquery.
	ent "github.com/txoutbox/txoutbox/adapters/ent/internal/testent"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// setupExample opens one SQLite database for ent and the outbox, and
// starts an outbox whose listener sends to delivered.
func setupExample(ctx context.Context, dir string) (*ent.Client, *outbox.Outbox, chan outbox.Event) {
	sqlDB, _ := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	client := ent.NewClient(ent.Driver(entsql.OpenDB(dialect.SQLite, sqlDB)))
	if err := client.Schema.Create(ctx); err != nil {
		panic(err)
	}
	store := sqlstore.Must(sqlstore.New(sqlx.NewDb(sqlDB, "sqlite"), sqlstore.Options{}))
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	ob, _ := outbox.New(store, outbox.Config{})
	delivered := make(chan outbox.Event, 1)
	ob.Handle("notify", func(ctx context.Context, ev outbox.Event) error {
		delivered <- ev
		return nil
	}, "order.placed")

	ob.Start(ctx)
	return client, ob, delivered
}

// Publish in an ent transaction: the event is written in the same
// transaction as the order and delivered once tx.Commit succeeds.
func Example() {
	dir, _ := os.MkdirTemp("", "entoutbox")
	defer os.RemoveAll(dir)
	client, ob, delivered := setupExample(context.Background(), dir)
	defer client.Close()
	defer ob.Close(context.Background())
	ctx := outbox.NewContext(context.Background(), ob) // or outbox.SetDefault(ob)

	tx, err := client.Tx(ctx)
	if err != nil {
		panic(err)
	}
	ctx = entoutbox.Bind(ctx, tx) // outbox.Publish(ctx, …) now writes through tx
	tx.Order.Create().SetCustomer("ada").SetTotal(42).SaveX(ctx)
	if _, err := outbox.Publish(ctx, outbox.Envelope{Type: "order.placed", JSON: []byte(`{"customer":"ada"}`)}); err != nil {
		tx.Rollback()
		panic(err)
	}
	fmt.Println("committed:", tx.Commit() == nil)
	ev := <-delivered
	fmt.Printf("delivered %s %s\n", ev.Type, ev.JSON)
	// Output:
	// committed: true
	// delivered order.placed {"customer":"ada"}
}

// One transaction per request: the handler writes through the request's
// *ent.Tx and publishes with the request's context.
func ExampleTransactional() {
	dir, _ := os.MkdirTemp("", "entoutbox")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	client, ob, delivered := setupExample(ctx, dir)
	defer client.Close()
	defer ob.Close(ctx)

	mw := entoutbox.Transactional(client, middleware.WithOutbox(ob))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx := entoutbox.Tx[*ent.Tx](r.Context())
		order, err := tx.Order.Create().SetCustomer("ada").SetTotal(42).Save(r.Context())
		if err != nil {
			http.Error(w, "could not store the order", http.StatusInternalServerError)
			return
		}
		body := fmt.Appendf(nil, `{"order":%d}`, order.ID)
		if _, err := outbox.Publish(r.Context(), outbox.Envelope{Type: "order.placed", JSON: body}); err != nil {
			http.Error(w, "could not publish", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated) // commit, then the hooks, then the 201
	}))

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/orders", nil))
	fmt.Println("status:", rec.Code)
	ev := <-delivered
	fmt.Printf("delivered %s %s\n", ev.Type, ev.JSON)
	// Output:
	// status: 201
	// delivered order.placed {"order":1}
}

package gormoutbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	_ "modernc.org/sqlite" // driver "sqlite"

	gormoutbox "github.com/txoutbox/txoutbox/adapters/gorm"
	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Publish inside db.Transaction: the event is written in the same
// transaction as the order and delivered once it commits.
func Example() {
	dir, _ := os.MkdirTemp("", "gormoutbox")
	defer os.RemoveAll(dir)
	ctx := context.Background()

	// One *sql.DB (modernc SQLite) for GORM and the outbox store.
	sqlDB, _ := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer sqlDB.Close()
	db, _ := gorm.Open(sqlite.Dialector{Conn: sqlDB}, &gorm.Config{Logger: logger.Discard})
	if err := db.Use(&gormoutbox.Plugin{}); err != nil {
		panic(err)
	}
	db.AutoMigrate(&Order{})

	store := sqlstore.Must(sqlstore.New(sqlx.NewDb(sqlDB, "sqlite"), sqlstore.Options{}))
	store.Migrate(ctx)
	ob, _ := outbox.New(store, outbox.Config{})
	delivered := make(chan outbox.Event, 1)
	ob.Handle("notify", func(ctx context.Context, ev outbox.Event) error {
		delivered <- ev
		return nil
	}, "order.placed")

	ob.Start(ctx)
	defer ob.Close(ctx)

	err := db.WithContext(outbox.NewContext(ctx, ob)).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Customer: "ada", Total: 42}).Error; err != nil {
			return err
		}
		_, err := gormoutbox.Publish(tx, outbox.Envelope{Type: "order.placed", JSON: []byte(`{"customer":"ada"}`)})
		return err
	})
	fmt.Println("committed:", err == nil)
	ev := <-delivered
	fmt.Printf("delivered %s %s\n", ev.Type, ev.JSON)
	// Output:
	// committed: true
	// delivered order.placed {"customer":"ada"}
}

// One transaction per request: the handler writes through the request's
// *gorm.DB and publishes with the request's context.
func ExampleTransactional() {
	dir, _ := os.MkdirTemp("", "gormoutbox")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	sqlDB, _ := sql.Open("sqlite", sqlstore.SQLiteDSN(filepath.Join(dir, "app.db")))
	defer sqlDB.Close()
	db, _ := gorm.Open(sqlite.Dialector{Conn: sqlDB}, &gorm.Config{Logger: logger.Discard})
	db.Use(&gormoutbox.Plugin{})
	db.AutoMigrate(&Order{})
	store := sqlstore.Must(sqlstore.New(sqlx.NewDb(sqlDB, "sqlite"), sqlstore.Options{}))
	store.Migrate(ctx)
	ob, _ := outbox.New(store, outbox.Config{})
	delivered := make(chan outbox.Event, 1)
	ob.Handle("audit", func(ctx context.Context, ev outbox.Event) error {
		delivered <- ev
		return nil
	}, "order.placed")

	ob.Start(ctx)
	defer ob.Close(ctx)

	mw := gormoutbox.Transactional(db, middleware.WithOutbox(ob))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		order := Order{Customer: "ada", Total: 42}
		if err := gormoutbox.DB(r.Context()).Create(&order).Error; err != nil {
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

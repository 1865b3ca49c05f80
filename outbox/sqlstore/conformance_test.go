package sqlstore_test

import (
	"context"
	"testing"

	"github.com/txoutbox/txoutbox/internal/leakcheck"
	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/outbox/storetest"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// TestConformance runs the store conformance suite on every database.
func TestConformance(t *testing.T) {
	for _, name := range testdb.Names {
		t.Run(name, func(t *testing.T) {
			testdb.Open(t, name) // skip (or fail in CI) early if the server is missing
			storetest.Run(t, storetest.Harness{
				NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) {
					db := testdb.Open(t, name)
					st := testdb.Store(t, db)
					return st, func(ctx context.Context) (storetest.Tx, error) { return outbox.BeginTx(ctx, db.DB, nil) }
				},
				ConcurrentWriters: name != "sqlite",
			})
		})
	}
	// The same contract with delivered events deleted, not kept DONE.
	for _, name := range testdb.Names {
		t.Run(name+"-delete-delivered", func(t *testing.T) {
			testdb.Open(t, name)
			storetest.Run(t, storetest.Harness{
				NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) {
					db := testdb.Open(t, name)
					st := testdb.StoreWith(t, db, sqlstore.Options{DeleteDelivered: true})
					return st, func(ctx context.Context) (storetest.Tx, error) { return outbox.BeginTx(ctx, db.DB, nil) }
				},
				ConcurrentWriters: name != "sqlite",
				DeletesDelivered:  true,
			})
		})
	}
	// The same contract with delivered events archived: the table holds
	// what is still owed, as with DeleteDelivered.
	for _, name := range testdb.Names {
		t.Run(name+"-archive-delivered", func(t *testing.T) {
			testdb.Open(t, name)
			storetest.Run(t, storetest.Harness{
				NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) {
					db := testdb.Open(t, name)
					st := testdb.StoreWith(t, db, sqlstore.Options{ArchiveDelivered: true})
					return st, func(ctx context.Context) (storetest.Tx, error) { return outbox.BeginTx(ctx, db.DB, nil) }
				},
				ConcurrentWriters: name != "sqlite",
				DeletesDelivered:  true,
				ArchivesDelivered: true,
			})
		})
	}
	// The same contract on a MariaDB table partitioned by day.
	t.Run("mysql-partitioned", func(t *testing.T) {
		testdb.MySQL(t)
		storetest.Run(t, storetest.Harness{
			NewStore: func(t *testing.T) (driver.Store, storetest.Beginner) {
				db := testdb.MySQL(t)
				st := testdb.Store(t, db)
				if err := st.Partition(context.Background(), sqlstore.PartitionConfig{Ahead: 1}); err != nil {
					t.Fatal(err)
				}
				return st, func(ctx context.Context) (storetest.Tx, error) { return outbox.BeginTx(ctx, db.DB, nil) }
			},
			ConcurrentWriters: true,
			RefusesOnce:       true, // its primary key (id, created_at) cannot refuse a reused id
		})
	})
}

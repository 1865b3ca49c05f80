package sqlstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/internal/testdb"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
)

// Tenant shards that are databases of one MariaDB server, with tables of
// the same name, do not share named locks: MySQL's GET_LOCK belongs to
// the server, so a lock named after the bare table made one shard's
// partition maintenance find another's lock held and do nothing, and its
// Migrate wait for another's.
func TestShardDatabasesDoNotShareLocks(t *testing.T) {
	admin := testdb.MySQL(t)
	ctx := context.Background()
	table := testdb.TableName("outbox")
	var stores []*sqlstore.Store
	for range 2 {
		dbName := testdb.TableName("test_shard")
		if _, err := admin.Exec("CREATE DATABASE " + dbName); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := admin.Exec("DROP DATABASE " + dbName); err != nil {
				t.Errorf("drop database %s: %v", dbName, err)
			}
		})
		cfg, err := mysql.ParseDSN(testdb.MySQLDSN())
		if err != nil {
			t.Fatal(err)
		}
		cfg.DBName = dbName
		db, err := sqlx.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		st := testdb.StoreWith(t, db, sqlstore.Options{Table: table})
		if err := st.Partition(ctx, sqlstore.PartitionConfig{}); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, st)
	}
	a, b := stores[0], stores[1]
	holder, err := a.DB().Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	for _, prefix := range []string{"txoutbox_partitions_", "txoutbox_migrate_"} {
		lock := sqlstore.LockName(t, a, prefix)
		if other := sqlstore.LockName(t, b, prefix); other == lock {
			t.Fatalf("both shards' %s lock is %q", prefix, lock)
		}
		var got int
		if err := holder.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", lock).Scan(&got); err != nil || got != 1 {
			t.Fatalf("take %s: %d, %v", lock, got, err)
		}
	}
	res, err := b.MaintainPartitions(ctx, sqlstore.PartitionConfig{})
	if err != nil || res.Busy {
		t.Fatalf("partition maintenance of one shard while another's runs: %+v, %v; want it done", res, err)
	}
	if res, err := a.MaintainPartitions(ctx, sqlstore.PartitionConfig{}); err != nil || !res.Busy {
		t.Fatalf("partition maintenance of the shard whose lock is held: %+v, %v; want Busy", res, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	if err := b.Migrate(wctx); err != nil {
		t.Fatalf("Migrate of one shard while another migrates: %v", err)
	}
	if err := a.Migrate(wctx); err == nil || !strings.Contains(err.Error(), "migration lock") {
		t.Fatalf("Migrate of the shard whose lock is held: %v; want an error about the migration lock", err)
	}
}

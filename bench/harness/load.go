package harness

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jmoiron/sqlx"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/sqlstore"
	"github.com/txoutbox/txoutbox/txmw"
)

// The load test (issue: 64 clients on MariaDB): two instances behind chi
// and txmw.Transactional on real loopback listeners, one shared outbox
// table, many keep-alive HTTP clients. Each request inserts an order row
// and publishes one event. Reported: request latency, the share of events
// delivered on the hot path, lost and duplicated events. The same clients
// against a baseline server whose handler writes the order and a minimal
// outbox row by hand (BEGIN, two INSERTs, COMMIT; no engine) show what the
// machine itself allows.

// LoadOptions configure one load run.
type LoadOptions struct {
	Clients   int
	Duration  time.Duration
	Instances int
	// Rate, if positive, paces the clients to this many requests per
	// second in all (open loop); latency then counts from each request's
	// scheduled time, so a stall is not hidden by the clients waiting.
	// Zero: closed loop, every client as fast as it can.
	Rate float64
	// Baseline runs the hand-written handler instead of txoutbox.
	Baseline bool
	Log      func(format string, args ...any)
}

// LoadResult is one load run.
type LoadResult struct {
	System    string
	Clients   int
	Rate      float64 // offered, requests/s; 0 closed loop
	Requests  int64
	Errors    int64
	ReqPerSec float64
	P50, P90  time.Duration
	P99, Max  time.Duration
	Committed int64 // order rows in the table
	Delivered int64 // distinct events delivered
	Hot       int64 // first deliveries on the hot path
	Lost      int64
	Dups      int64
	Drain     time.Duration // from the last request to the last delivery
	Note      string
}

// HotShare is the share of delivered events that came on the hot path.
func (r LoadResult) HotShare() float64 {
	if r.Delivered == 0 {
		return 0
	}
	return float64(r.Hot) / float64(r.Delivered)
}

// RunLoad runs one load test on db's database.
func RunLoad(ctx context.Context, db *sqlx.DB, dsn string, o LoadOptions) (LoadResult, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	o.Instances = max(o.Instances, 1)
	prefix := UniquePrefix("load")
	orders := MariaDB.Quote(prefix + "_orders")
	if err := createOrders(ctx, db, orders); err != nil {
		return LoadResult{}, err
	}
	defer db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+orders)
	res := LoadResult{System: "txoutbox (2 instances, chi + txmw)", Clients: o.Clients, Rate: o.Rate}
	if o.Baseline {
		res.System = "baseline (chi, BEGIN + 2 INSERTs + COMMIT by hand)"
	}

	// Deliveries, recorded by order number.
	var mu sync.Mutex
	seen := map[int64]int{}
	var hot atomic.Int64
	lastDelivery := atomic.Int64{}
	record := func(ctx context.Context, ev outbox.Event) error {
		seq, _ := strconv.ParseInt(ev.AggregateID, 10, 64)
		mu.Lock()
		seen[seq]++
		first := seen[seq] == 1
		mu.Unlock()
		if first && ev.Path == outbox.PathHot && ev.Attempt == 1 {
			hot.Add(1)
		}
		lastDelivery.Store(time.Now().UnixNano())
		return nil
	}

	var seqs atomic.Int64
	var handlers []http.Handler
	var closers []func()
	defer func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}()
	if o.Baseline {
		minimal := MariaDB.Quote(prefix + "_outbox")
		if err := createMinimal(ctx, db, minimal, prefix); err != nil {
			return res, err
		}
		closers = append(closers, func() { db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+minimal) })
		for range o.Instances {
			pool, err := sql.Open("mysql", dsn)
			if err != nil {
				return res, err
			}
			pool.SetMaxOpenConns(o.Clients)
			pool.SetMaxIdleConns(o.Clients)
			closers = append(closers, func() { pool.Close() })
			r := chi.NewRouter()
			insOrder := insertOrderSQL(db, orders)
			insEvent := `INSERT INTO ` + minimal + ` (id, event_type, aggregate_id, payload, created_at) VALUES (?, 'OrderPlaced', ?, ?, UTC_TIMESTAMP(6))`
			r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
				seq := seqs.Add(1)
				ctx := r.Context()
				tx, err := pool.BeginTx(ctx, nil)
				if err == nil {
					if _, err = tx.ExecContext(ctx, insOrder, orderArgs(seq)...); err == nil {
						var id [16]byte // unique: the time and the order number
						binary.BigEndian.PutUint64(id[:8], uint64(time.Now().UnixNano()))
						binary.BigEndian.PutUint64(id[8:], uint64(seq))
						if _, err = tx.ExecContext(ctx, insEvent, id[:], strconv.FormatInt(seq, 10), Payload(seq)); err == nil {
							err = tx.Commit()
						}
					}
					if err != nil {
						tx.Rollback()
					}
				}
				if err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			handlers = append(handlers, r)
		}
	} else {
		table := prefix + "_outbox"
		for i := range o.Instances {
			pool, err := sqlx.Open("mysql", dsn)
			if err != nil {
				return res, err
			}
			pool.SetMaxOpenConns(o.Clients + 8)
			pool.SetMaxIdleConns(o.Clients + 8)
			closers = append(closers, func() { pool.Close() })
			st, err := sqlstore.New(pool, sqlstore.Options{Table: table})
			if err != nil {
				return res, err
			}
			if i == 0 {
				if err := st.Migrate(ctx); err != nil {
					return res, err
				}
				closers = append(closers, func() {
					for _, t := range st.Tables() {
						db.ExecContext(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+t)
					}
				})
			}
			ob, err := outbox.New(st, outbox.Config{InstanceID: fmt.Sprintf("load-%d", i), Logger: quietLogger()})
			if err != nil {
				return res, err
			}
			ob.Handle("load", record, OrderPlaced)
			if err := ob.Start(context.WithoutCancel(ctx)); err != nil {
				return res, err
			}
			closers = append(closers, func() { ob.Close(context.Background()) })
			r := chi.NewRouter()
			r.Use(txmw.Transactional(pool, middleware.WithOutbox(ob)))
			insOrder := insertOrderSQL(db, orders)
			r.Post("/orders", func(w http.ResponseWriter, r *http.Request) {
				seq := seqs.Add(1)
				ctx := r.Context()
				if _, err := txmw.Tx(ctx).ExecContext(ctx, insOrder, orderArgs(seq)...); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				if _, err := outbox.Publish(ctx, outbox.Envelope{Type: OrderPlaced, AggregateType: "order", AggregateID: strconv.FormatInt(seq, 10), JSON: Payload(seq)}); err != nil {
					http.Error(w, err.Error(), http.StatusInternalServerError)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			handlers = append(handlers, r)
		}
	}

	// Real listeners on loopback.
	var urls []string
	for _, h := range handlers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return res, err
		}
		srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go srv.Serve(ln)
		closers = append(closers, func() { srv.Shutdown(context.Background()) })
		urls = append(urls, "http://"+ln.Addr().String()+"/orders")
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * o.Clients, MaxIdleConnsPerHost: o.Clients, IdleConnTimeout: time.Minute}}
	lat := make([][]time.Duration, o.Clients)
	var errs atomic.Int64
	start := time.Now()
	end := start.Add(o.Duration)
	var wg sync.WaitGroup
	for c := range o.Clients {
		wg.Go(func() {
			url := urls[c%len(urls)]
			var interval time.Duration
			if o.Rate > 0 {
				interval = time.Duration(float64(o.Clients) / o.Rate * float64(time.Second))
			}
			next := start.Add(time.Duration(c) * interval / time.Duration(o.Clients))
			for {
				sent := time.Now()
				if o.Rate > 0 {
					if next.After(end) {
						return
					}
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					sent = next // latency from the scheduled time
					next = next.Add(interval)
				} else if sent.After(end) {
					return
				}
				resp, err := client.Post(url, "application/json", nil)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusCreated {
						err = errors.New(resp.Status)
					}
				}
				if err != nil {
					errs.Add(1)
					continue
				}
				lat[c] = append(lat[c], time.Since(sent))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	client.CloseIdleConnections()

	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	res.Requests, res.Errors = int64(len(all)), errs.Load()
	res.ReqPerSec = float64(len(all)) / elapsed.Seconds()
	if len(all) > 0 {
		q := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
		res.P50, res.P90, res.P99, res.Max = q(0.50), q(0.90), q(0.99), all[len(all)-1]
	}
	if err := db.GetContext(ctx, &res.Committed, "SELECT COUNT(*) FROM "+orders); err != nil {
		return res, err
	}
	if o.Baseline {
		return res, nil
	}
	// Wait for the last deliveries (the poller takes what the hot path
	// left, within a lease at worst).
	lastReq := time.Now()
	deadline := lastReq.Add(60 * time.Second)
	for {
		mu.Lock()
		n := int64(len(seen))
		mu.Unlock()
		if n >= res.Committed || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var ids []int64
	if err := db.SelectContext(ctx, &ids, "SELECT id FROM "+orders); err != nil {
		return res, err
	}
	mu.Lock()
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			res.Lost++
		case n > 1:
			res.Dups += int64(n - 1)
		}
	}
	res.Delivered = int64(len(seen))
	mu.Unlock()
	res.Hot = hot.Load()
	if t := lastDelivery.Load(); t > 0 {
		res.Drain = max(0, time.Unix(0, t).Sub(lastReq))
	}
	return res, nil
}

// WriteLoad writes the load test's section of the report: every run, and
// the targets of the robustness issue against the medians.
func WriteLoad(w io.Writer, runs []LoadResult) {
	fmt.Fprintf(w, "## Load: 64 HTTP clients, two instances, MariaDB\n\n")
	fmt.Fprintf(w, "Two txoutbox instances, each a chi router with `txmw.Transactional` on a real loopback listener, share one outbox table; every request inserts an order row and publishes one event. Keep-alive HTTP clients in the same process spread over both instances. **Closed loop**: every client sends its next request when the last one answered (latency is then mostly queueing: mean ≈ clients ÷ throughput). **Paced**: the clients together offer a fixed rate (a fraction of the baseline's closed-loop throughput), and latency counts from each request's scheduled send time, so a stall shows in full. The **baseline** is the same server and clients with a handler that runs BEGIN, INSERT order, INSERT a minimal outbox row (binary id, type, aggregate id, JSON payload, created-at, one index) and COMMIT by hand: what this machine allows without the engine. Hot share = events whose first delivery came on the hot path.\n\n")
	fmt.Fprintf(w, "| system | load | req/s | p50 | p90 | p99 | max | errors | hot share | lost | dups | drain after last request |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		load := "closed loop"
		if r.Rate > 0 {
			load = fmt.Sprintf("paced %.0f req/s", r.Rate)
		}
		hotShare, lost, dups, drain := "–", "–", "–", "–"
		if !strings.HasPrefix(r.System, "baseline") {
			hotShare, lost, dups, drain = fmt.Sprintf("%.2f %%", 100*r.HotShare()), strconv.FormatInt(r.Lost, 10), strconv.FormatInt(r.Dups, 10), r.Drain.Round(time.Millisecond).String()
		}
		fmt.Fprintf(w, "| %s | %s, %d clients | %.0f | %v | %v | %v | %v | %d | %s | %s | %s | %s |\n",
			r.System, load, r.Clients, r.ReqPerSec, ms(r.P50), ms(r.P90), ms(r.P99), ms(r.Max), r.Errors, hotShare, lost, dups, drain)
	}
	fmt.Fprintln(w)
}

func ms(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 1, 64) + " ms"
}

// LoadTargets evaluates the robustness issue's targets on the txoutbox
// runs: request p99 ≤ 50 ms and max ≤ 1 s, ≥ 99 % of events delivered on
// the hot path, 0 lost; closed-loop and paced runs apart.
func LoadTargets(runs []LoadResult) []Target {
	var ts []Target
	for _, paced := range []bool{false, true} {
		var p99s []float64
		var maxLat time.Duration
		minHot, lost, n := 1.0, int64(0), 0
		var base []float64
		for _, r := range runs {
			if (r.Rate > 0) != paced {
				continue
			}
			if strings.HasPrefix(r.System, "baseline") {
				base = append(base, float64(r.P99))
				continue
			}
			n++
			p99s = append(p99s, float64(r.P99))
			maxLat = max(maxLat, r.Max)
			minHot = min(minHot, r.HotShare())
			lost += r.Lost
		}
		if n == 0 {
			continue
		}
		mode := "closed loop"
		if paced {
			mode = "paced"
		}
		p99 := statOf(p99s)
		b := statOf(base)
		ts = append(ts,
			target(fmt.Sprintf("Load, %s: request p99 (64 clients, 2 instances)", mode), "≤ 50 ms",
				fmt.Sprintf("%s (%s–%s); baseline without the engine %s", ms(time.Duration(p99.med)), ms(time.Duration(p99.lo)), ms(time.Duration(p99.hi)), ms(time.Duration(b.med))),
				p99.med <= float64(50*time.Millisecond)),
			target(fmt.Sprintf("Load, %s: request max", mode), "≤ 1 s", ms(maxLat), maxLat <= time.Second),
			target(fmt.Sprintf("Load, %s: events delivered on the hot path", mode), "≥ 99 %", fmt.Sprintf("%.2f %% (lowest run)", 100*minHot), minHot >= 0.99),
			target(fmt.Sprintf("Load, %s: events lost", mode), "0", strconv.FormatInt(lost, 10), lost == 0),
		)
	}
	return ts
}

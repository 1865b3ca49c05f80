package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/txoutbox/txoutbox/middleware"
	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/txmw"
)

// HTTP runs the business transaction as a real HTTP request over
// loopback: a net/http server on 127.0.0.1:0 with a chi router, and one
// keep-alive http.Client shared by the producers, which POST the event's
// JSON to /orders/{seq}. The server and the clients share this process.
//
// With Baseline the handler runs BEGIN, INSERT order, INSERT a minimal
// outbox row, COMMIT by hand with database/sql; otherwise the router has
// r.Use(txmw.Transactional(db, middleware.WithOutbox(ob))) and the handler
// inserts the order through txmw.Tx and calls outbox.Publish (txoutbox
// with the default Config, hot path on).
type HTTP struct {
	Baseline bool

	env    *Env
	ob     *Txoutbox // the engine, when not Baseline
	tables []string
	srv    *http.Server
	client *http.Client
	url    string
}

// Names of the HTTP systems; HTTPBaselineName is the reference of their
// ratios.
var (
	HTTPBaselineName = (&HTTP{Baseline: true}).Name()
	HTTPTxoutboxName = (&HTTP{}).Name()
)

func (s *HTTP) Name() string {
	if s.Baseline {
		return "HTTP baseline: chi, BEGIN + order + minimal outbox row + COMMIT by hand"
	}
	return "HTTP txoutbox: chi + txmw.Transactional + outbox.Publish"
}

func (s *HTTP) Delivers() bool { return !s.Baseline }

// maxClients bounds the idle keep-alive connections the client keeps: at
// least the largest concurrency of the report.
const maxClients = 256

func (s *HTTP) Setup(ctx context.Context, env *Env) error {
	s.env = env
	r := chi.NewRouter()
	qOrder := insertOrderSQL(env.DB, env.Orders)
	if s.Baseline {
		t := env.dialect().Quote(env.Prefix + "_min")
		s.tables = []string{t}
		if err := createMinimal(ctx, env.DB, t, env.Prefix+"_min"); err != nil {
			return err
		}
		qEvent := minimalInsert(env.DB, t)
		r.Post("/orders/{seq}", func(w http.ResponseWriter, r *http.Request) {
			seq, payload, err := readOrder(r)
			if err == nil {
				err = s.baselineTx(r.Context(), qOrder, qEvent, seq, payload)
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
	} else {
		s.ob = &Txoutbox{HotPath: true}
		if err := s.ob.Setup(ctx, env); err != nil {
			return err
		}
		r.Use(txmw.Transactional(env.DB, middleware.WithOutbox(s.ob.ob)))
		r.Post("/orders/{seq}", func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			seq, payload, err := readOrder(r)
			if err == nil {
				_, err = txmw.Tx(ctx).ExecContext(ctx, qOrder, orderArgs(seq)...)
			}
			if err == nil {
				// Registered first, so it runs first after COMMIT.
				err = outbox.AfterCommit(ctx, func() { env.Rec.Committed(seq) })
			}
			if err == nil {
				_, err = outbox.Publish(ctx, envelope(seq, payload))
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go s.srv.Serve(ln)
	s.url = "http://" + ln.Addr().String() + "/orders/"
	s.client = &http.Client{Transport: &http.Transport{MaxIdleConns: maxClients, MaxIdleConnsPerHost: maxClients, IdleConnTimeout: time.Minute}}
	return nil
}

// readOrder returns the order number of the URL and the request body.
func readOrder(r *http.Request) (int64, []byte, error) {
	seq, err := strconv.ParseInt(chi.URLParam(r, "seq"), 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("bad order number: %w", err)
	}
	payload, err := io.ReadAll(r.Body)
	return seq, payload, err
}

func (s *HTTP) baselineTx(ctx context.Context, qOrder, qEvent string, seq int64, payload []byte) error {
	tx, err := s.env.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, qOrder, orderArgs(seq)...); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, qEvent, minimalRow(seq, payload)...); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	s.env.Rec.Committed(seq)
	return nil
}

// Tx POSTs the order and its event; it drains and closes the body so the
// connection is reused.
func (s *HTTP) Tx(ctx context.Context, seq int64, payload []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+strconv.FormatInt(seq, 10), bytes.NewReader(payload))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("harness: POST /orders: %s %s", resp.Status, bytes.TrimSpace(body))
	}
	return nil
}

func (s *HTTP) quietPeriod() time.Duration {
	if s.ob == nil {
		return 0
	}
	return s.ob.quietPeriod()
}

func (s *HTTP) Teardown(ctx context.Context) error {
	var errs []error
	if s.srv != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		errs = append(errs, s.srv.Shutdown(cctx))
		cancel()
		s.client.CloseIdleConnections()
	}
	if s.ob != nil {
		errs = append(errs, s.ob.Teardown(ctx))
	}
	if len(s.tables) > 0 {
		errs = append(errs, dropTables(ctx, s.env.DB, s.tables...))
	}
	return errors.Join(errs...)
}

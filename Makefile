# txoutbox: the two commands a newcomer needs are `make run` and `make test`.
GO      ?= go
# Nested modules, each with its own go.mod so that their heavy dependencies
# (httpexpect, GORM, ent, Watermill) never reach users of the library.
MODULES := $(patsubst %/go.mod,%,$(wildcard */go.mod adapters/*/go.mod admin/*/go.mod internal/*/go.mod examples/*/go.mod))

# SKIPLOG collects the database suites the tests skipped (no server).
SKIPLOG := $(CURDIR)/.skipped-db-suites

.PHONY: test sim lint vet bench bench-ordered bench-inbox bench-instances bench-stats bench-rate bench-delayed bench-load bench-partitions bench-connectors bench-ordered-drain bench-ordered-outage run fmt

## test: vet and race-test every module against the real databases; lists the database suites that were skipped.
test: vet
	@rm -f $(SKIPLOG)
	TXOUTBOX_SKIP_LOG=$(SKIPLOG) $(GO) test -race -count=1 -timeout 30m ./...
	@echo "== conformance suite without -race (full load on SQLite)"
	TXOUTBOX_SKIP_LOG=$(SKIPLOG) $(GO) test -count=1 -run TestConformance ./outbox/sqlstore/
	@for m in $(MODULES); do \
		echo "== $$m"; \
		(cd $$m && TXOUTBOX_SKIP_LOG=$(SKIPLOG) $(GO) test -race -count=1 -timeout 15m ./...) || exit 1; \
	done
	@if [ -s $(SKIPLOG) ]; then echo "== database suites that did not run:"; sort -u $(SKIPLOG) | sed 's|$(CURDIR)/||'; else echo "== every database suite ran"; fi

## sim: the deterministic simulation of the engine (outbox/internal/sim; docs/design/simulation.md): SEEDS seeds (default 2000, about 2 min) from SIM_FROM, SIM_FAULTS fault classes (default all; a comma-separated list of crash,close,freeze,join,outage,pause,replay,skip,storeerr,slow,orphan for fewer); SIM_SEED=n replays one seed and prints its trace. .ci/run runs it.
SEEDS      ?= 2000
SIM_FROM   ?= 1
SIM_FAULTS ?= all
sim:
	SIM_RUN=1 SIM_SEED=$(SIM_SEED) $(GO) test -count=1 -timeout 60m -run 'TestSim$$' ./outbox/internal/sim/ -seeds $(SEEDS) -from $(SIM_FROM) -faults $(SIM_FAULTS) $(if $(SIM_SEED),-v)

## run: start the demo orders service (embedded SQLite in ./data; see demo/restapi/README.md).
run:
	@mkdir -p bin
	$(GO) build -o bin/restapi ./demo/restapi
	exec ./bin/restapi

vet:
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then echo "gofmt: these files need formatting (run make fmt):"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

## lint: gofmt, go vet (staticcheck if installed).
lint: vet
	@if command -v staticcheck >/dev/null; then staticcheck ./...; else echo "staticcheck not installed; skipped"; fi

fmt:
	gofmt -w .

## bench: on the local MariaDB and PostgreSQL (-db mariadb,postgres; -dsn, -pg-dsn): producer tables against the raw minimal-row and sqlstore-row limits and Watermill's forwarder, the HTTP rows (chi + txmw vs a hand-written handler), backlog drains and memory, the ordered-subscription rows (16 producers over 1,000 keys: raw SQL order + minimal outbox row without and with the key-row upsert, whose ratio is the raw floor, -ordered-raw=false skips them; then Unordered vs Ordered; -ordered=false skips them all), then the inbox rows (make bench-inbox; -inbox=false skips them), the delayed-events rows (make bench-delayed; -delayed=false skips them), then the connector table (NATS, RabbitMQ, Redis, Kafka on kfake; -connectors=false skips it) (~75 min on 2 cores; the load test is make bench-load); writes BENCHMARKS.md. BENCHFLAGS passes flags (see `go run ./cmd/outboxbench -h` in bench/).
bench:
	cd bench && $(GO) run ./cmd/outboxbench -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-ordered: only the ordered-subscription rows (16 producers over 1,000 keys; per repeat raw SQL without then with the key-row upsert (the raw floor; BENCHFLAGS=-ordered-raw=false skips them), then Unordered, then Ordered subscription; MariaDB and PostgreSQL; ~3 min); replaces the section "Ordered subscriptions" of BENCHMARKS.md (make bench includes the rows).
bench-ordered:
	cd bench && $(GO) run ./cmd/outboxbench -only-ordered -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-ordered-drain: issue 34's ordered backlog row, BenchmarkOrderedBesideUnorderedDrain (10,000 events over 100 keys to an Ordered and an Unordered subscription with 5 ms handlers, drained by 3 instances; SQLite, MariaDB, PostgreSQL; ~2 min); prints each subscription's events/s and ordered/unordered, which the section "Ordered backlog beside an unordered subscription" of BENCHMARKS.md records.
bench-ordered-drain:
	$(GO) test -count=1 -run '^$$' -bench OrderedBesideUnorderedDrain -benchtime 10000x ./outbox/sqlstore/

## bench-ordered-outage: the row of the sequencer's quiet keys, BenchmarkOrderedOutage (an Ordered destination down 5 s while 8 producers publish over 100 keys; MariaDB, PostgreSQL; ~15 s): claims of heads during the outage and the producers' events/s, which the section "Ordering heuristics" of BENCHMARKS.md records.
bench-ordered-outage:
	$(GO) test -count=1 -run '^$$' -bench OrderedOutage -benchtime 1x ./outbox/sqlstore/

## bench-inbox: only the inbox rows (issue 36; MariaDB and PostgreSQL; ~10 min): natsoutbox/kafkaoutbox inbox consumers against a hand-written consume → BEGIN → dedupe INSERT → effect → COMMIT → ack loop with the same client (NATS JetStream on 127.0.0.1:4222, Kafka on an in-process kfake), 5,000 messages, 4 at once, repeats interleaved; then the cost of a duplicate against a BEGIN/key lookup/ROLLBACK; replaces the section "Inbox" of BENCHMARKS.md (make bench includes the rows).
bench-inbox:
	cd bench && $(GO) run ./cmd/outboxbench -only-inbox -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-instances: only the many-instances rows (50 engines in one process on one table, default PollInterval and 50 ms, 500 events/s, then Close with 5 s; MariaDB and PostgreSQL; ~4 min): claim, DONE and lease-renewal p99 and the acknowledged events left not DONE; replaces the section "Many instances" of BENCHMARKS.md (make bench includes the rows).
bench-instances:
	cd bench && $(GO) run ./cmd/outboxbench -only-instances -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-stats: only the statistics rows (a drain of 200,000 events, default Config, on a table whose statistics were gathered before the backlog built up vs gathered after it; MariaDB and PostgreSQL, 3 repeats; ~10 min); replaces the section "Backlog drain and table statistics" of BENCHMARKS.md (make bench includes the rows).
bench-stats:
	cd bench && $(GO) run ./cmd/outboxbench -only-stats -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-rate: only the rate-limit rows (a subscription limited to 500 events/s with a backlog present; a 200,000-event drain beside it, on other events and on the same events, against the same drain beside the same subscription unlimited, and alone; MariaDB and PostgreSQL, 5 repeats, each limited run next to its baseline; ~18 min); replaces the section "Rate limit" of BENCHMARKS.md (make bench includes the rows).
bench-rate:
	cd bench && $(GO) run ./cmd/outboxbench -only-rate -repeats 5 -rate-drain 200000 -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-delayed: only the delayed-events rows (issue 35; MariaDB and PostgreSQL; ~30 min): 1,000,000 events with NotBefore spread evenly over 10 minutes (-delayed-events, -delayed-window; the first due -delayed-lead after the publishing starts, by default 10 s + the events at 4,000/s), published by 8 producers 100 to a transaction, delivered by one engine (default Config); lateness (receive − NotBefore) p50/p99/max against p99 ≤ 1 s, delivered rate, and the live heap before the publishing, once all are scheduled and once all are delivered (flat: no memory per scheduled event); replaces the section "Delayed events" of BENCHMARKS.md (make bench includes the rows).
bench-delayed:
	cd bench && $(GO) run ./cmd/outboxbench -only-delayed -out ../BENCHMARKS.md $(BENCHFLAGS)

## bench-load: only the load test (64 HTTP clients, two instances, MariaDB; ~6 min); writes docs/bench/load.md.
bench-load:
	cd bench && $(GO) run ./cmd/outboxbench -only-load -out ../docs/bench/load.md $(BENCHFLAGS)

## bench-partitions: MariaDB day partitions: dropping 1M delivered rows vs batched DELETE, claim latency with 5M DONE rows (~5 min); writes docs/bench/partitions.md.
bench-partitions:
	cd bench && $(GO) run ./cmd/partbench -out ../docs/bench/partitions.md $(BENCHFLAGS)

## bench-connectors: only the connector table: raw client vs txoutbox vs Watermill's forwarder to NATS, RabbitMQ, Redis and Kafka (kfake) from the local MariaDB (~3 min); writes docs/bench/connectors.md.
bench-connectors:
	cd bench && $(GO) run ./cmd/outboxbench -only-connectors -out ../docs/bench/connectors.md $(BENCHFLAGS)

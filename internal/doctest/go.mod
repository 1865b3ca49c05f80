module github.com/txoutbox/txoutbox/internal/doctest

go 1.26.0

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/jmoiron/sqlx v1.4.0
	github.com/nats-io/nats.go v1.55.0
	github.com/prometheus/client_golang v1.25.0
	github.com/twmb/franz-go v1.22.2
	github.com/txoutbox/txoutbox v0.1.0
	github.com/txoutbox/txoutbox/adapters/kafka v0.1.0
	github.com/txoutbox/txoutbox/adapters/nats v0.1.0
	modernc.org/sqlite v1.61.1
)

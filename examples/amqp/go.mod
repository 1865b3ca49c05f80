module github.com/txoutbox/txoutbox/examples/amqp

go 1.26.0

require (
	github.com/jmoiron/sqlx v1.4.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/txoutbox/txoutbox v0.1.0
	github.com/txoutbox/txoutbox/adapters/amqp v0.1.0
	modernc.org/sqlite v1.61.1
)

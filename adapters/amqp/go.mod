module github.com/txoutbox/txoutbox/adapters/amqp

go 1.26.0

require (
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/txoutbox/txoutbox v0.1.0
)

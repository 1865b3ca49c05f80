module github.com/txoutbox/txoutbox/examples/webhook

go 1.26.0

require (
	github.com/txoutbox/txoutbox v0.1.0
	github.com/txoutbox/txoutbox/adapters/webhook v0.1.0
)

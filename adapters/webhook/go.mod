module github.com/txoutbox/txoutbox/adapters/webhook

go 1.26.0

require github.com/txoutbox/txoutbox v0.1.0

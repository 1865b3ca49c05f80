package harness

// Systems returns every system of the producer workload, in report order.
func Systems() []System {
	return []System{
		&Raw{WithOutbox: false},
		&Raw{WithOutbox: true},
		&Watermill{},
		&Watermill{Tuned: true},
		&Txoutbox{HotPath: true},
		&Txoutbox{HotPath: false},
	}
}

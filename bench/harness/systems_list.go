package harness

// Systems returns every system of the producer workload, in report order.
func Systems() []System {
	return []System{
		&Raw{Row: RawNone},
		&Raw{Row: RawMinimal},
		&Raw{Row: RawSqlstore},
		&Watermill{},
		&Watermill{Tuned: true},
		&Txoutbox{HotPath: true},
		&Txoutbox{HotPath: true, DeleteDelivered: true},
		&Txoutbox{HotPath: true, ArchiveDelivered: true},
		&Txoutbox{HotPath: false},
		&HTTP{Baseline: true},
		&HTTP{},
	}
}

package sqlstore

import (
	"fmt"
	"time"
)

// dbTime scans a time column whatever the driver hands over: time.Time
// (MySQL with parseTime=true, PostgreSQL), text (MySQL without parseTime)
// or integer microseconds (SQLite).
type dbTime struct{ time.Time }

var textLayouts = []string{"2006-01-02 15:04:05.999999", "2006-01-02T15:04:05.999999Z07:00", time.RFC3339Nano}

func (t *dbTime) Scan(v any) error {
	switch x := v.(type) {
	case nil:
		t.Time = time.Time{}
	case time.Time:
		t.Time = x.UTC()
	case int64:
		t.Time = time.UnixMicro(x).UTC()
	case float64:
		t.Time = time.UnixMicro(int64(x)).UTC()
	case []byte:
		return t.parse(string(x))
	case string:
		return t.parse(x)
	default:
		return fmt.Errorf("sqlstore: cannot scan %T into a time", v)
	}
	return nil
}

func (t *dbTime) parse(s string) error {
	for _, l := range textLayouts {
		if p, err := time.ParseInLocation(l, s, time.UTC); err == nil {
			t.Time = p.UTC()
			return nil
		}
	}
	return fmt.Errorf("sqlstore: cannot parse time %q", s)
}

package sqlstore

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/txoutbox/txoutbox/outbox"
	"github.com/txoutbox/txoutbox/outbox/driver"
)

// rowColumns are the columns scanRow reads, in order.
const rowColumns = "id, event_type, aggregate_type, aggregate_id, tenant_id, headers, payload, payload_json, occurred_at, status, attempts, created_at, locked_by, ordering_key, key_seq"

const nRowColumns = 15

var rowColumnNames = strings.Split(rowColumns, ", ")

// scanRow reads one row of rowColumns (and then extra, which must not fail)
// without ever failing on a value: every column is scanned into an any and
// converted here, and what cannot be converted is collected, by column, in
// the row's ReadError. One damaged row (a zero date, 'infinity', text in a
// time column, a payload_json of 5) must not fail the claim of the others:
// the engine buries it. Only a row whose id cannot be read fails.
func scanRow(rs interface{ Scan(...any) error }, extra ...any) (driver.Row, error) {
	var vals [nRowColumns]any
	dest := make([]any, 0, nRowColumns+len(extra))
	for i := range vals {
		dest = append(dest, &vals[i])
	}
	dest = append(dest, extra...)
	var r driver.Row
	if err := rs.Scan(dest...); err != nil {
		return r, err
	}
	var problems []string
	bad := func(col int, why string) {
		problems = append(problems, rowColumnNames[col]+": "+why)
	}
	id, err := textValue(vals[0], false)
	if err != nil || id == "" {
		return r, fmt.Errorf("sqlstore: a row's id cannot be read (%v); fix or delete it by hand", cmpErr(err, "empty"))
	}
	r.ID = id
	for i, p := range []*string{&r.Type, &r.AggregateType, &r.AggregateID, &r.TenantID} {
		if *p, err = textValue(vals[1+i], i > 0); err != nil {
			bad(1+i, err.Error())
		}
	}
	if r.Headers, err = bytesValue(vals[5]); err != nil {
		bad(5, err.Error())
	}
	if r.Payload, err = bytesValue(vals[6]); err != nil {
		bad(6, err.Error())
	}
	if r.PayloadJSON, err = boolValue(vals[7]); err != nil {
		bad(7, err.Error())
	}
	var t dbTime
	if err := t.Scan(vals[8]); err != nil || t.IsZero() {
		bad(8, timeProblem(vals[8], err))
	}
	r.OccurredAt = t.Time
	status, err := intValue(vals[9])
	if err != nil {
		bad(9, err.Error())
	}
	r.Status = outbox.Status(status)
	if r.Attempts, err = intValue(vals[10]); err != nil {
		bad(10, err.Error())
	}
	t = dbTime{}
	if err := t.Scan(vals[11]); err != nil || t.IsZero() {
		bad(11, timeProblem(vals[11], err))
	}
	r.CreatedAt = t.Time
	if r.PrevOwner, err = textValue(vals[12], true); err != nil {
		bad(12, err.Error())
	}
	if r.OrderingKey, err = textValue(vals[13], true); err != nil {
		bad(13, err.Error())
	}
	if vals[14] != nil {
		seq, err := intValue(vals[14])
		if err != nil {
			bad(14, err.Error())
		}
		r.KeySeq = int64(seq)
	}
	if len(problems) > 0 {
		r.ReadError = errors.New("stored row cannot be read: " + strings.Join(problems, "; "))
	}
	return r, nil
}

func cmpErr(err error, def string) string {
	if err != nil {
		return err.Error()
	}
	return def
}

// quoteValue quotes a short prefix of a stored value for an error message.
// Only non-payload columns are ever quoted, and never more than 32 bytes.
func quoteValue(v any) string {
	var s string
	switch x := v.(type) {
	case []byte:
		s = string(x)
	case string:
		s = x
	default:
		return fmt.Sprintf("%v", x)
	}
	if len(s) > 32 {
		s = s[:32] + "…"
	}
	return strconv.Quote(strings.ToValidUTF8(s, "\uFFFD"))
}

func timeProblem(v any, err error) string {
	switch {
	case v == nil:
		return "is NULL"
	case err == nil:
		return "is a zero date"
	}
	return "not a valid time: " + quoteValue(v)
}

func textValue(v any, nullOK bool) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	case nil:
		if nullOK {
			return "", nil
		}
		return "", errors.New("is NULL")
	case int64, float64:
		return fmt.Sprint(x), nil
	}
	return "", fmt.Errorf("unexpected %T", v)
}

func bytesValue(v any) ([]byte, error) {
	switch x := v.(type) {
	case []byte:
		return x, nil
	case string:
		return []byte(x), nil
	case nil:
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected %T", v)
}

func boolValue(v any) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case int64:
		if x == 0 || x == 1 {
			return x == 1, nil
		}
	case []byte, string:
		s, _ := textValue(x, false)
		switch strings.ToLower(s) {
		case "0", "f", "false":
			return false, nil
		case "1", "t", "true":
			return true, nil
		}
	}
	return false, fmt.Errorf("%s is not a boolean (0 or 1)", quoteValue(v))
}

func intValue(v any) (int, error) {
	switch x := v.(type) {
	case int64:
		return int(x), nil
	case int32:
		return int(x), nil
	case int16:
		return int(x), nil
	case []byte, string:
		s, _ := textValue(x, false)
		if n, err := strconv.Atoi(s); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s is not an integer", quoteValue(v))
}

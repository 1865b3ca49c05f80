package inbox

import "strings"

// Row statuses of <table>_inbox. They are part of the table's format.
const (
	statusApplied = 1
	statusParked  = 2
	statusPurged  = 3
)

type queries struct {
	claim, countFailure, readFailures, park, dropFailures string
	entry, listAll, listAfter, unpark, reparkError, purge string
	expire, expireFailures                                string
}

func buildQueries(d *Dialect, inbox, fails string) queries {
	t := func(q string) string { return d.bind(strings.ReplaceAll(q, "{{t}}", fails)) }
	cols := `consumer, message_id, received_at, attempts, COALESCE(last_error, ''), headers, payload`
	return queries{
		claim: d.bind(d.insert + inbox + ` (consumer, message_id, status, received_at, attempts) VALUES (?, ?, 1, ` + d.now + `, 1)` + d.skipExisting),
		countFailure: t(`INSERT INTO ` + fails + ` (consumer, message_id, attempts, last_error, failed_at) VALUES (?, ?, 1, ?, ` + d.now + `)` +
			d.upsertFailure),
		readFailures: d.bind(`SELECT attempts FROM ` + fails + ` WHERE consumer = ? AND message_id = ?`),
		park: d.bind(d.insert + inbox + ` (consumer, message_id, status, received_at, attempts, last_error, headers, payload) VALUES (?, ?, 2, ` +
			d.now + `, ?, ?, ?, ?)` + d.skipExisting),
		dropFailures: d.bind(`DELETE FROM ` + fails + ` WHERE consumer = ? AND message_id = ?`),
		entry:        d.bind(`SELECT ` + cols + ` FROM ` + inbox + ` WHERE consumer = ? AND message_id = ? AND status = 2`),
		listAll:      d.bind(`SELECT ` + cols + ` FROM ` + inbox + ` WHERE status = 2 AND (consumer > ? OR (consumer = ? AND message_id > ?)) ORDER BY consumer, message_id LIMIT ?`),
		listAfter:    d.bind(`SELECT ` + cols + ` FROM ` + inbox + ` WHERE status = 2 AND consumer = ? AND message_id > ? ORDER BY message_id LIMIT ?`),
		unpark: d.bind(`UPDATE ` + inbox + ` SET status = 1, received_at = ` + d.now +
			`, attempts = attempts + 1, last_error = NULL, headers = NULL, payload = NULL WHERE consumer = ? AND message_id = ? AND status = 2`),
		reparkError:    d.bind(`UPDATE ` + inbox + ` SET attempts = attempts + 1, last_error = ? WHERE consumer = ? AND message_id = ? AND status = 2`),
		purge:          d.bind(`UPDATE ` + inbox + ` SET status = 3, headers = NULL, payload = NULL WHERE consumer = ? AND message_id = ? AND status = 2`),
		expire:         expireSQL(d, inbox, `status IN (1, 3) AND received_at < `+d.nowMinus),
		expireFailures: expireSQL(d, fails, `failed_at < `+d.nowMinus),
	}
}

// expireSQL is one batch of a cleanup: the first ? is the age, the second
// the batch size.
func expireSQL(d *Dialect, table, where string) string {
	if d.deleteLimit {
		return d.bind(`DELETE FROM ` + table + ` WHERE ` + where + ` LIMIT ?`)
	}
	return d.bind(`DELETE FROM ` + table + ` WHERE (consumer, message_id) IN (SELECT consumer, message_id FROM ` + table + ` WHERE ` + where + ` LIMIT ?)`)
}

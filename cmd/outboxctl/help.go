package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
)

// commands is each command's synopsis and what it does, for its -h.
var commands = map[string][2]string{
	"migrate up":          {"migrate up [-allow-unsupported-server]", "Apply the pending schema migrations (Store.Migrate, with its lock) and name them.\nA server known not to work (docs/databases.md) is refused unless\n-allow-unsupported-server."},
	"migrate status":      {"migrate status", "List the migrations and whether each is applied."},
	"stats":               {"stats [-watch 5s]", "Counts by status, per event type and per subscription: pending, retrying,\ndead letters, age of the oldest pending (lag). -watch repeats until\ninterrupted."},
	"dead list":           {"dead list [filters] [-limit 100]", "List dead letters: DEAD events and the dead deliveries of split events, in\nid order. Never payloads."},
	"dead show":           {"dead show ID [-payload]", "One event with its delivery per subscription; the payload only with\n-payload."},
	"dead replay":         {"dead replay [ID...|filters] [-dry-run] [-yes] [-rate N]", "Make the dead letters the ids or filters select due again, N per second.\nWithout ids or a filter it selects every dead letter and needs -yes;\nwithout -yes it only counts them and exits 3. -dry-run prints the count\nand the first ids."},
	"dead purge":          {"dead purge [ID...|filters] [-yes]", "Delete dead letters. Without -yes it only counts them and exits 3."},
	"pause":               {"pause SUB", "Pause a subscription on every instance."},
	"resume":              {"resume SUB", "Resume a paused subscription on every instance."},
	"retire":              {"retire SUB [-yes] [-idle 1m]", "Retire a subscription that no instance runs any more: it leaves the\nregistry, its pending and retrying deliveries are dropped (its dead ones\nstay as dead letters), and the events that waited only for them become\nDONE. Without -yes it only counts them and exits 3. Refused while an\ninstance registered it within -idle."},
	"cleanup":             {"cleanup [-older 168h] [-dead] [-limit 1000] [-dry-run] [-yes]", "Delete delivered events last due more than -older ago (with -dead, dead\nletters and finished split events too). Without -yes it only counts them\nand exits 3; -dry-run counts them and exits 0."},
	"peek":                {"peek [-limit 20]", "The next due events and deliveries, earliest first, without taking them."},
	"blocked-keys":        {"blocked-keys [-ordered SUB,...] [-skip-dead SUB,...] [-after KEY] [-limit 100]", "Ordering keys blocked for an Ordered subscription by a dead event. The\nordered subscriptions are those the table records (instances register\nthem at start), or those named."},
	"skip":                {"skip ID... [-yes]", "Give up on dead events for good (done, last error kept) so that the keys\nthey block go on. Without -yes it only counts them and exits 3."},
	"partitions status":   {"partitions status [-archive]", "MySQL/MariaDB: the table's day partitions (-archive: the archive's, by the\nday its events were delivered)."},
	"scheduled list":      {"scheduled list [-limit 100]", "Events not due yet (Envelope.NotBefore, or given back for a while),\nearliest first, with their due times on the database's clock."},
	"scheduled cancel":    {"scheduled cancel ID... [-yes]", "Take events back before they are due: they are marked done and never\ndelivered. An ordered event cannot be (its key waits behind it). Without\n-yes it only names them and exits 3."},
	"archive search":      {"archive search [-id ID] [-type T] [-aggregate TYPE[/ID]] [-after ID] [-limit 100]", "Delivered events the store moved into its archive (sqlstore's\nOptions.ArchiveDelivered), by id, type or aggregate, in id order, with\nwhen and by which instance they were delivered. Never payloads: archive\nshow ID prints one."},
	"archive show":        {"archive show ID [-payload]", "One event, from the table or the archive, with when and by whom it was\ndelivered; the payload only with -payload."},
	"archive cleanup":     {"archive cleanup [-older 720h] [-limit 1000] [-yes]", "Delete archived events delivered more than -older ago, -limit rows per\nDELETE (what Config.ArchiveRetention does on every instance). Without\n-yes it only exits 3."},
	"partitions maintain": {"partitions maintain [-create] [-ahead 7] [-retention 168h -yes] [-dead] [-archive-retention 2160h -yes]", "Add the days ahead; with -retention (and -yes), drop the days past it that\nhold nothing undelivered; with -archive-retention, the archive's days past it.\n-create partitions the table and its archive if they are not yet."},
}

// groupHelp is the help of a command group (migrate, dead, partitions) or
// of one command given by name.
func groupHelp(name string) string {
	if name == "" {
		return usage
	}
	if c, ok := commands[name]; ok {
		return "Usage:\n  outboxctl " + c[0] + "\n\n" + c[1] + "\n\nRun outboxctl " + name + " -h for its flags; outboxctl -h for the global flags\nand exit codes.\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Usage:\n")
	var names []string
	for n := range commands {
		if strings.HasPrefix(n, name+" ") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if len(names) == 0 {
		return usage
	}
	for _, n := range names {
		fmt.Fprintf(&b, "  outboxctl %s\n", commands[n][0])
	}
	fmt.Fprintf(&b, "\nRun outboxctl %s SUBCOMMAND -h for one of them; outboxctl -h for the\nglobal flags and exit codes.\n", name)
	return b.String()
}

// commandHelp prints the help of the command whose flags fs holds, on
// stdout.
func (c *cli) commandHelp(fs *flag.FlagSet) {
	syn, what := fs.Name(), ""
	if cmd, ok := commands[fs.Name()]; ok {
		syn, what = cmd[0], cmd[1]+"\n"
	}
	fmt.Fprintf(c.stdout, "Usage:\n  outboxctl %s\n\n%s\nFlags:\n", syn, what)
	fs.SetOutput(c.stdout)
	fs.PrintDefaults()
	fs.SetOutput(c.stderr)
	fmt.Fprintln(c.stdout, "\nExit codes and the DSN forms: outboxctl -h.")
}

// Command outboxctl operates a txoutbox outbox table from the command
// line: migrations, statistics, dead letters, pausing subscriptions,
// cleanup and a look at the next due events. Run outboxctl -h for the
// commands and exit codes; see README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK      = 0 // success
	exitError   = 1 // the database or the command failed
	exitUsage   = 2 // bad command line
	exitNothing = 3 // nothing matched, or a confirmation flag is missing
)

const usage = `outboxctl operates a txoutbox outbox table.

Usage:
  outboxctl [global flags] COMMAND [flags] [args]

Commands:
  migrate up [-allow-unsupported-server]
                             apply the pending schema migrations; a server
                             known not to work is refused unless allowed
  migrate status             list the migrations and whether they are applied
  stats [-watch 5s]          counts per event type and per subscription:
                             pending, retrying, dead letters, oldest age (lag)
  dead list [filters]        list dead letters (never payloads)
  dead show ID [-payload]    one event with its deliveries; the payload
                             only with -payload
  dead replay [ID...|filters] [-dry-run] [-yes] [-rate N]
                             make dead letters due again, N per second;
                             -dry-run prints the count and the first ids;
                             without ids or filters it needs -yes (without
                             it, it only counts them and exits 3)
  dead purge [ID...|filters] [-yes]
                             delete dead letters; without -yes it only
                             counts them and exits 3
  scheduled list [-limit 100] events not due yet (Envelope.NotBefore),
                             earliest first, with their due times
  scheduled cancel ID... [-yes]
                             take events back before they are due; without
                             -yes it only names them and exits 3
  archive search [-id ID] [-type T] [-aggregate TYPE[/ID]] [-after ID] [-limit 100]
                             delivered events kept in the archive
                             (Options.ArchiveDelivered), in id order; never
                             payloads
  archive show ID [-payload] one event, archived or not, with when and by
                             whom it was delivered
  archive cleanup [-older 720h] [-limit 1000] [-yes]
                             delete archived events delivered more than
                             -older ago; without -yes it only exits 3
  inbox list [-consumer C] [-limit 100]
                             parked inbox messages (package inbox), never
                             payloads
  inbox show CONSUMER ID [-payload]
                             one parked message with its headers and last
                             error; the payload only with -payload
  inbox purge CONSUMER ID... [-yes]
                             drop parked messages (their ids still
                             de-duplicate); without -yes it only counts
                             them and exits 3
  inbox cleanup [-retention 168h] [-limit 1000]
                             delete the inbox's dedupe rows older than
                             -retention (replay needs the service's handler:
                             Inbox.Replay in Go)
  pause SUB / resume SUB     pause or resume a subscription everywhere
  retire SUB [-yes] [-idle 1m]
                             retire a subscription no instance runs any
                             more: drop what it still owes (its dead
                             deliveries stay); without -yes it only counts
                             and exits 3; refused while an instance
                             registered it within -idle
  cleanup [-older 168h] [-dead] [-dry-run] [-yes]
                             delete delivered events older than -older
                             (with -dead, dead letters too); without -yes
                             it only counts them and exits 3
  peek [-limit 20]           the next due events and deliveries, earliest
                             first, without taking them
  blocked-keys [-ordered SUB,...] [-skip-dead SUB,...] [-after KEY] [-limit 100]
                             ordering keys blocked for an Ordered
                             subscription by a dead event, with the
                             subscription; the ordered subscriptions are
                             those the table records (instances register
                             them at start), or those named
  skip ID... [-yes]          give up on dead events for good (done, last
                             error kept) so that the keys they block go on;
                             without -yes it only counts them and exits 3
  partitions status          MySQL/MariaDB: the table's day partitions
  partitions maintain [-create] [-ahead 7] [-retention 168h -yes] [-dead]
                             add the days ahead, drop days past retention
                             that hold nothing undelivered (needs -yes);
                             -create partitions a table that is not yet
  help [COMMAND]             this help, or a command's; so does -h after
                             any command

Filters (dead list, replay, purge):
  -sub NAME  -type TYPE  -since T  -until T  -error TEXT
  T is RFC 3339 (2026-01-02T15:04:05Z) or a duration ago (24h).

Global flags (also accepted after the command):
  -dsn DSN     the database; default $DATABASE_URL. mysql://user:pass@host:3306/db,
               user:pass@tcp(host:3306)/db, postgres://user:pass@host:5432/db,
               sqlite:path/to/file.db. Passwords are never printed.
  -table NAME  the outbox table (default outbox_event)
  -json        print one JSON document instead of aligned text

Text output escapes control and bidi characters found in the data (\x1b,
\u202e); -json prints the values as they are.

Exit codes:
  0  success
  1  error (database, migration, I/O)
  2  usage: unknown command, bad flag or argument
  3  nothing matched (dead show of an unknown id, dead replay/purge that
     selected nothing, pause/resume of an unknown subscription, skip of
     ids that are not dead, retire of an unknown subscription), or a
     confirmation is missing: dead purge, skip, cleanup and retire without
     -yes, dead replay of everything (no id, no filter) without -yes or
     -dry-run
`

// cli is one invocation.
type cli struct {
	ctx    context.Context
	env    func(string) string
	stdout io.Writer
	stderr io.Writer

	dsn, table string
	json       bool
	// anyServer: migrate up -allow-unsupported-server.
	anyServer bool
}

// exitErr carries an exit code other than exitError.
type exitErr struct {
	code int
	msg  string
}

func (e *exitErr) Error() string { return e.msg }

func usageErr(format string, args ...any) error {
	return &exitErr{code: exitUsage, msg: fmt.Sprintf(format, args...)}
}

func nothing(format string, args ...any) error {
	return &exitErr{code: exitNothing, msg: fmt.Sprintf(format, args...)}
}

func run(ctx context.Context, args []string, env func(string) string, stdout, stderr io.Writer) int {
	c := &cli{ctx: ctx, env: env, stdout: stdout, stderr: stderr}
	fs := c.flags("outboxctl")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return exitOK
		}
		fmt.Fprintln(stderr, "run outboxctl -h for help")
		return exitUsage
	}
	err := c.dispatch(fs.Args())
	if err == nil {
		return exitOK
	}
	err = c.redact(err)
	var ee *exitErr
	if errors.As(err, &ee) {
		if ee.msg != "" {
			fmt.Fprintln(stderr, "outboxctl:", escLines(ee.msg))
		}
		if ee.code == exitUsage {
			fmt.Fprintln(stderr, "run outboxctl -h for help")
		}
		return ee.code
	}
	// Error text may quote the data (a handler's error, an id): escaped
	// like the text output.
	fmt.Fprintln(stderr, "outboxctl:", escLines(err.Error()))
	return exitError
}

// isHelp reports whether arg asks for help.
func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// flags returns a flag set with the global flags.
func (c *cli) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(c.stderr)
	// Help (-h) is printed on stdout by the caller; a bad flag gets its
	// error from the flag package and a pointer to -h.
	fs.Usage = func() {}
	if name == "outboxctl" {
		fs.StringVar(&c.dsn, "dsn", "", "database DSN (default $DATABASE_URL)")
		fs.StringVar(&c.table, "table", "", "outbox table (default outbox_event)")
		fs.BoolVar(&c.json, "json", false, "print JSON")
		return fs
	}
	// After the command, the global flags again, defaulting to what was
	// given before it.
	fs.Func("dsn", "database DSN (default $DATABASE_URL)", func(v string) error { c.dsn = v; return nil })
	fs.Func("table", "outbox table (default outbox_event)", func(v string) error { c.table = v; return nil })
	fs.BoolFunc("json", "print JSON", func(v string) error { c.json = v != "false"; return nil })
	return fs
}

// parse parses a command's flags, which may come before or after its
// arguments, and returns the arguments. -h prints the command's help on
// stdout and ends the command with exit 0.
func (c *cli) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				c.commandHelp(fs)
				return nil, &exitErr{code: exitOK}
			}
			return nil, &exitErr{code: exitUsage}
		}
		args = fs.Args()
		if len(args) == 0 {
			return rest, nil
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
}

// group is a command with subcommands.
type group struct {
	subs map[string]func(args []string) error
	want string // the subcommands, for a usage error
}

// groups are the commands with subcommands (inbox has its own).
func (c *cli) groups() map[string]group {
	return map[string]group{
		"migrate":    {map[string]func([]string) error{"up": c.migrateUp, "status": c.migrateStatus}, "up or status"},
		"dead":       {map[string]func([]string) error{"list": c.deadList, "show": c.deadShow, "replay": c.deadReplay, "purge": c.deadPurge}, "list, show, replay or purge"},
		"partitions": {map[string]func([]string) error{"status": c.partitionsStatus, "maintain": c.partitionsMaintain}, "status or maintain"},
		"scheduled":  {map[string]func([]string) error{"list": c.scheduledList, "cancel": c.scheduledCancel}, "list or cancel"},
		"archive":    {map[string]func([]string) error{"search": c.archiveSearch, "show": c.archiveShow, "cleanup": c.archiveCleanup}, "search, show or cleanup"},
	}
}

// singles are the commands without subcommands that take their args as
// they are.
func (c *cli) singles() map[string]func(args []string) error {
	return map[string]func([]string) error{
		"stats": c.stats, "retire": c.retire, "cleanup": c.cleanup, "peek": c.peek,
		"blocked-keys": c.blockedKeys, "skip": c.skip,
	}
}

func (c *cli) dispatch(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(c.stderr, usage)
		return &exitErr{code: exitUsage}
	}
	cmd, args := args[0], args[1:]
	sub := func() (string, []string, error) {
		if len(args) == 0 {
			return "", nil, usageErr("%s: want a subcommand", cmd)
		}
		if isHelp(args[0]) {
			fmt.Fprint(c.stdout, groupHelp(cmd))
			return "", nil, &exitErr{code: exitOK}
		}
		return args[0], args[1:], nil
	}
	if g, ok := c.groups()[cmd]; ok {
		s, rest, err := sub()
		if err != nil {
			return err
		}
		if f := g.subs[s]; f != nil {
			return f(rest)
		}
		return usageErr("%s %s: want %s", cmd, s, g.want)
	}
	switch cmd {
	case "inbox":
		return c.inboxCmd(sub)
	case "pause", "resume":
		return c.pause(cmd, args)
	case "help":
		fmt.Fprint(c.stdout, groupHelp(strings.Join(args, " ")))
		return nil
	}
	if f := c.singles()[cmd]; f != nil {
		return f(args)
	}
	return usageErr("unknown command %q", cmd)
}

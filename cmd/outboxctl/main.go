// Command outboxctl operates an outbox table from the command line: it
// applies and shows migrations, shows the backlog and each subscription's
// lag, lists, shows and replays dead letters, pauses and resumes
// subscriptions, and cleans up delivered events. It works on every
// database sqlstore supports.
//
//	outboxctl [-dsn DSN] [-table NAME] [-json] COMMAND [ARGS]
//
// The DSN comes from -dsn or DATABASE_URL, in the forms the demo accepts:
// mysql://user:pw@host:3306/db (or go-sql-driver's user:pw@tcp(host)/db),
// postgres://user:pw@host:5432/db, sqlite:path/to/file.db. Passwords are
// never printed.
//
// Exit codes: 0 done; 1 the command failed (the database, the DSN); 2 the
// command line is wrong; 3 nothing matched (a dead letter that is not
// there, a replay that selects nothing) or a confirmation is missing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
)

// Exit codes.
const (
	exitOK       = 0
	exitFailed   = 1
	exitUsage    = 2
	exitNoMatch  = 3
	usageCommand = `commands:
  migrate up                 create or upgrade the tables (idempotent)
  migrate status             the migrations and whether each is applied
  stats                      events by status; each subscription's lag
  dead list [filters]        dead letters, without payloads
  dead show ID [-payload]    one event with its deliveries and attempts
  dead replay [-ids A,B] [filters] [-dry-run] [-rate N]
                             make dead letters due again (dry run: count and first ids)
  pause SUB / resume SUB     stop or restart a subscription on every instance
  cleanup -older-than D [-dead] [-confirm]
                             delete delivered (and with -dead, dead) events older than D

filters: -subscription S -type T -since RFC3339 -until RFC3339 -error TEXT -limit N`
)

// errNoMatch is a command that found nothing to act on.
var errNoMatch = errors.New("nothing matched")

// usageError is a wrong command line.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is the program: it returns the exit code.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("outboxctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsnFlag := fs.String("dsn", "", "database to operate on (default: $DATABASE_URL)")
	table := fs.String("table", "", "the outbox table (default: sqlstore's, outbox_event)")
	jsonOut := fs.Bool("json", false, "print one JSON document instead of aligned text")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: outboxctl [-dsn DSN] [-table NAME] [-json] COMMAND [ARGS]\n\n%s\n\nexit codes: 0 done, 1 failed, 2 usage, 3 nothing matched or confirmation missing\n\nflags:\n", usageCommand)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	dsn := *dsnFlag
	if dsn == "" {
		dsn = getenv("DATABASE_URL")
	}
	c := &cli{out: stdout, json: *jsonOut}
	err := c.open(ctx, dsn, *table)
	if err == nil {
		defer c.close()
		err = c.dispatch(ctx, fs.Args())
	}
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "outboxctl: %v\n\n%s\n", err, usageCommand)
		return exitUsage
	case errors.Is(err, errNoMatch):
		fmt.Fprintf(stderr, "outboxctl: %v\n", err)
		return exitNoMatch
	}
	fmt.Fprintf(stderr, "outboxctl: %v\n", err)
	return exitFailed
}

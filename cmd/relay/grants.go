package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/outbox-operator/outbox-operator/internal/contract"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/relay"
)

// grantsCmd prints the SQL that grants each part of outbox-operator exactly the privileges it
// needs on the table (outboxdb.GrantSQL, docs/privileges.md). It connects to nothing.
func grantsCmd(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	c := relay.DefaultConfig()
	var r outboxdb.Roles
	ownerOnly := false
	fs := flag.NewFlagSet("relay grants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&r.Owner, "owner-role", "", "the role that owns the schema, applies the migrations and runs the operator (required)")
	fs.StringVar(&r.Relay, "relay-role", "", "the role the relays connect as")
	fs.StringVar(&r.Writer, "writer-role", "", "the role the applications append events as (outbox.Append)")
	fs.StringVar(&r.Consumer, "consumer-role", "", "the role the consumers dedupe as (inbox.Process)")
	fs.StringVar(&r.Reader, "reader-role", "", "a read-only role: kubectl outbox status, events, published")
	fs.BoolVar(&r.WaitForStandbys, "wait-for-standbys", false, "the relays run with --wait-for-standbys: their role may read the standbys' positions (pg_read_all_stats)")
	fs.BoolVar(&ownerOnly, "owner-part", false, "print only the statements the owner runs itself, after each upgrade")
	if err := relay.ParseSettings(fs, &c, args, getenv, contract.FlagTable); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "relay grants: %v\n", err)
		return 2
	}
	if r.Owner == "" {
		fmt.Fprintln(stderr, "relay grants: --owner-role is required")
		return 2
	}
	render := outboxdb.GrantSQL
	if ownerOnly {
		render = outboxdb.OwnerGrantSQL
	}
	script, err := render(c.Table, r)
	if err != nil {
		fmt.Fprintf(stderr, "relay grants: %v\n", err)
		return 2
	}
	fmt.Fprint(stdout, script)
	return 0
}

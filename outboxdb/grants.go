package outboxdb

// Least privilege (docs/privileges.md): the PostgreSQL privileges each part of outbox-operator
// needs for one outbox table, rendered as SQL a database administrator can run. None of the parts
// needs SUPERUSER, REPLICATION, CREATEDB, CREATEROLE or BYPASSRLS.
//
// Every function the migrations create is SECURITY INVOKER: it runs with the privileges of its
// caller, so a role needs EXECUTE on the function and the privileges on the tables it touches.
// The script therefore revokes PUBLIC's default EXECUTE on the table's functions (and PUBLIC's
// read of the wake-up sequence) and grants each role exactly what its statements use.
//
// The list below follows the statements in outboxdb/*.go, relay/*.go, outbox/, inbox/ and
// plugin/; TestGrantsCoverSchema fails when a migration adds a function, table or
// sequence that the script does not name, and TestLeastPrivilege* run every part as a role holding
// only these grants.

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Roles names the PostgreSQL roles that run the parts of one outbox table. Owner is required;
// a part whose role is empty gets no grants, and a part whose role is the owner needs none (the
// owner holds every privilege on the objects it owns). A role may be a group role (NOLOGIN) whose
// members log in: several services that append events share one writer role that way.
type Roles struct {
	// Owner owns the table's schema and every object the migrations create: outboxdb.Apply, the
	// partition upkeep, the wake-up trigger, shard layout changes, cursor resets and the acts by
	// hand (kubectl outbox skip, retry, replay) run as it. Under the operator this is the role of
	// spec.database.secretRef; the relay pods use it too unless spec.relay.databaseSecretRef
	// names the relay role's URL.
	Owner string
	// Relay runs the relays (relay run).
	Relay string
	// Writer runs the applications that append events (package outbox).
	Writer string
	// Consumer runs the consumers that dedupe with the table's inbox (package inbox).
	Consumer string
	// Reader reads the table's state: kubectl outbox status, events, published, replay --list and
	// --dry-run, <table>_pending() and <table>_published(id).
	Reader string
	// WaitForStandbys: the relays run with --wait-for-standbys, and their role reads the
	// standbys' positions (pg_read_all_stats).
	WaitForStandbys bool
}

// Who runs a statement of the script.
const (
	// ByAdmin: a database administrator, once, before the first migration: a superuser, or the
	// database's owner with ADMIN OPTION on pg_read_all_stats (PostgreSQL 16 and later; CREATEROLE
	// before) and the right to create a schema for the owner role.
	ByAdmin = "admin"
	// ByOwner: the owner role itself (or the administrator), after the migrations, and again after
	// every upgrade of the schema. The owner may grant on what it owns: no administrator needed.
	ByOwner = "owner"
)

// The parts a statement grants to.
const (
	PartOwner    = "owner"
	PartRelay    = "relay"
	PartWriter   = "writer"
	PartConsumer = "consumer"
	PartReader   = "reader"
	PartPublic   = "public" // revokes from PUBLIC
)

// Privilege is one statement of the script.
type Privilege struct {
	Part string // PartOwner, PartRelay, ... or PartPublic
	By   string // ByAdmin or ByOwner
	SQL  string // one statement, ending in ';'
	Why  string
}

// ErrInvalidRole is returned for a role name the script cannot grant to.
var ErrInvalidRole = errors.New("invalid role name")

// grantFunction is one function the migrations create (its identity arguments), and the parts
// that call it.
type grantFunction struct {
	suffix, args string
	parts        []string
}

// functions lists every function of the schema at LatestVersion, with the parts that call it
// besides the owner. Any other role needs none.
var functions = []grantFunction{
	{"create_partitions", "date, date", nil},
	{"partitions", "", []string{PartReader}},
	{"partition_has_pending", "text, timestamp with time zone", []string{PartReader}},
	{"droppable_partitions", "interval", nil},
	{"drop_partition", "text", nil},
	{"request_layout", "integer", nil},
	{"switch_layout", "integer", []string{PartRelay}},
	{"layout_released", "bigint", []string{PartRelay}},
	{"layout_locked", "bigint", []string{PartRelay}},
	{"layout_report", "bigint", nil},
	{"relay_wait", "interval, bigint[]", []string{PartRelay}},
	{"relay_woke", "", []string{PartRelay}},
	{"wake_wanted", "", []string{PartWriter}},
	{"append", "text, text, text, jsonb, jsonb, uuid", []string{PartWriter}},
	{"append_bytes", "text, text, text, bytea, jsonb, uuid", []string{PartWriter}},
	{"refuse_invalid", "text, text, text, jsonb", []string{PartWriter}},
	{"lock_insert", "", nil},
	{"locked_inserts", "", []string{PartReader}},
	{"set_locked_inserts", "boolean", nil},
	{"check_names", "", []string{PartReader}},
	{"checks", "", []string{PartReader}},
	{"set_checks", "boolean", nil},
	{"notify", "", nil},
	{"notifies", "", []string{PartReader}},
	{"set_notify", "boolean", nil},
	{"published", "bigint", []string{PartReader}},
	{"cursor_passed", "pg_snapshot, pg_snapshot, bigint, bigint, xid8", []string{PartRelay, PartReader}},
	{"pending", "", []string{PartReader}},
	{"snapshot_backlog", "smallint[], integer", []string{PartRelay, PartReader}},
	{"scalable_lag", "integer", []string{PartReader}},
}

// functionWhy says why a part calls a function.
var functionWhy = map[string]string{
	PartRelay + "/switch_layout":          "a relay run with --shard-count=N sets the layout itself when none exists or no other layout runs",
	PartRelay + "/layout_released":        "a relay that stands down for a reshard records when publishing paused",
	PartRelay + "/layout_locked":          "a relay that holds its buckets records when the reshard's pause ended",
	PartRelay + "/relay_wait":             "with --notify: claims a wait before waiting for a notification",
	PartRelay + "/relay_woke":             "with --notify: ends the claim when woken or stopping",
	PartRelay + "/cursor_passed":          "replays and the snapshot backlog decide with it whether a cursor passed an event",
	PartRelay + "/snapshot_backlog":       "snapshot tracking: the shard's backlog (outbox_pending, outbox_lag_seconds)",
	PartWriter + "/append":                "<table>_append(...): the SQL append of writers in any language (the aggregate's lock, then the insert)",
	PartWriter + "/append_bytes":          "<table>_append_bytes(...): the SQL append of a bytes payload (or a tombstone)",
	PartWriter + "/refuse_invalid":        "<table>_refuse_invalid(...): the SQL appends call it to refuse a bad event (migration 00023)",
	PartWriter + "/wake_wanted":           "the insert trigger's WHEN condition, evaluated with the inserting role's privileges (only while the trigger exists: notify mode)",
	PartReader + "/partitions":            "status lists the partitions and whether each may hold an unpublished event",
	PartReader + "/partition_has_pending": "called by <table>_partitions()",
	PartReader + "/locked_inserts":        "whether plain inserts take the aggregate's lock (relay inserts)",
	PartReader + "/check_names":           "called by <table>_checks()",
	PartReader + "/checks":                "whether the table refuses bad events at insert (relay checks)",
	PartReader + "/notifies":              "whether the table has its insert trigger (relay wakeups)",
	PartReader + "/published":             "<table>_published(id): was this event published",
	PartReader + "/cursor_passed":         "called by the backlog and published functions, and by replay --dry-run",
	PartReader + "/pending":               "<table>_pending(): the events not yet published",
	PartReader + "/snapshot_backlog":      "status: the backlog of a snapshot-tracked table",
	PartReader + "/scalable_lag":          "the lag more shards can fix, as the autoscaler reads it",
}

// CheckRole reports whether name can be granted to: a role name PostgreSQL accepts and that the
// grammar of GRANT does not read as something else (PUBLIC, CURRENT_USER, ...).
func CheckRole(name string) error {
	switch lower := strings.ToLower(name); {
	case name == "":
		return fmt.Errorf("%w: empty", ErrInvalidRole)
	case len(name) > 63:
		return fmt.Errorf("%w: %q is longer than 63 bytes", ErrInvalidRole, name)
	case strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '$' }):
		return fmt.Errorf("%w: %q contains a control character or '$'", ErrInvalidRole, name)
	case lower == "public" || lower == "none" || lower == "current_user" || lower == "current_role" || lower == "session_user":
		return fmt.Errorf("%w: %q is a reserved role name", ErrInvalidRole, name)
	case strings.HasPrefix(lower, "pg_"):
		return fmt.Errorf("%w: %q: role names starting with pg_ are PostgreSQL's own", ErrInvalidRole, name)
	}
	return nil
}

// Privileges returns every statement of the privileges script of t for roles r, in the order
// they must run: the administrator's first, then the owner's.
func Privileges(t Table, r Roles) ([]Privilege, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	if err := CheckRole(r.Owner); err != nil {
		return nil, fmt.Errorf("owner role: %w", err)
	}
	roles := map[string]string{}
	for _, p := range []struct{ part, name string }{
		{PartRelay, r.Relay}, {PartWriter, r.Writer}, {PartConsumer, r.Consumer}, {PartReader, r.Reader},
	} {
		if p.name == "" || p.name == r.Owner {
			continue
		}
		if err := CheckRole(p.name); err != nil {
			return nil, fmt.Errorf("%s role: %w", p.part, err)
		}
		roles[p.part] = p.name
	}
	q := func(role string) string { return pgx.Identifier{role}.Sanitize() }
	owner := q(r.Owner)
	schema := pgx.Identifier{t.Schema}.Sanitize()
	var out []Privilege
	add := func(part, by, why, format string, args ...any) {
		out = append(out, Privilege{Part: part, By: by, SQL: fmt.Sprintf(format, args...) + ";", Why: why})
	}
	// grant adds a statement for part, if the part has a role of its own.
	grant := func(part, why, format string, args ...any) {
		if role, ok := roles[part]; ok {
			add(part, ByOwner, why, format+" TO %s", append(args, q(role))...)
		}
	}

	// The administrator's part.
	if t.Schema == "public" {
		add(PartOwner, ByAdmin, "the owner creates the table's objects in the public schema (since PostgreSQL 15 only the database's owner may, by default)",
			"GRANT USAGE, CREATE ON SCHEMA public TO %s", owner)
	} else {
		add(PartOwner, ByAdmin, "the owner creates every object of the table in its schema; owning it, it needs no other privilege there",
			"CREATE SCHEMA IF NOT EXISTS %s AUTHORIZATION %s", schema, owner)
	}
	all := []string{owner}
	for _, part := range []string{PartRelay, PartWriter, PartConsumer, PartReader} {
		if role, ok := roles[part]; ok && !slices.Contains(all, q(role)) {
			all = append(all, q(role))
		}
	}
	// USAGE on the schema: the owner grants it on its own schema; on public, which it does not
	// own, the administrator does.
	ownsSchema := t.Schema != "public"
	if !ownsSchema {
		for _, part := range []string{PartRelay, PartWriter, PartConsumer, PartReader} {
			if role, ok := roles[part]; ok {
				add(part, ByAdmin, "every object of the table lives in this schema (explicit, for databases that revoked it from PUBLIC)",
					"GRANT USAGE ON SCHEMA %s TO %s", schema, q(role))
			}
		}
	}
	add(PartOwner, ByAdmin, "every part connects to the database (explicit, for databases that revoked CONNECT from PUBLIC)",
		"DO $grants$ BEGIN EXECUTE format('GRANT CONNECT ON DATABASE %%I TO %%s', current_database(), %s); END $grants$",
		QuoteLiteral(strings.Join(all, ", ")))
	if role, ok := roles[PartRelay]; ok && r.WaitForStandbys {
		add(PartRelay, ByAdmin, "--wait-for-standbys (spec.publish.waitForStandbys) reads the standbys' flush positions in "+
			"pg_stat_replication, which PostgreSQL shows only to superusers and members of pg_read_all_stats",
			"GRANT pg_read_all_stats TO %s", q(role))
	}
	add(PartOwner, ByAdmin, "partition retention under snapshot tracking keeps a day while a transaction that began before it ended is open "+
		"(<table>_partition_has_pending reads pg_stat_activity.xact_start); without it the owner sees only its own sessions' start times "+
		"(a transaction that already wrote into the partition is still seen, through pg_locks)",
		"GRANT pg_read_all_stats TO %s", owner)

	// The owner's part: what PUBLIC holds by default, then each part.
	for _, f := range functions {
		add(PartPublic, ByOwner, "the table's functions run with their caller's privileges; every role that calls one is granted EXECUTE below",
			"REVOKE ALL ON FUNCTION %s(%s) FROM PUBLIC", t.Derived(f.suffix), f.args)
	}
	add(PartPublic, ByOwner, "the writers and the relays are granted what they use of it below (migration 00005 grants SELECT to PUBLIC)",
		"REVOKE ALL ON SEQUENCE %s FROM PUBLIC", t.Derived("wake_until"))
	if ownsSchema {
		for _, part := range []string{PartRelay, PartWriter, PartConsumer, PartReader} {
			grant(part, "every object of the table lives in this schema", "GRANT USAGE ON SCHEMA %s", schema)
		}
	}

	// executes grants EXECUTE on the functions part calls.
	executes := func(part string) {
		for _, f := range functions {
			if slices.Contains(f.parts, part) {
				grant(part, functionWhy[part+"/"+f.suffix], "GRANT EXECUTE ON FUNCTION %s(%s)", t.Derived(f.suffix), f.args)
			}
		}
	}

	// The relay.
	grant(PartRelay, "the fetch, the backlog statement, snapshot tracking's batches, the copy of failed events into <table>_parked, replays",
		"GRANT SELECT ON TABLE %s", t.Ident())
	grant(PartRelay, "row tracking marks rows sent and records attempts and error; its fetch locks the rows FOR UPDATE, which needs UPDATE on a column",
		"GRANT UPDATE (sent_at, attempts, error) ON TABLE %s", t.Ident())
	grant(PartRelay, "pg_sequence_last_value: the fetch's position, snapshot bounds, the idle check, the snapshot backlog",
		"GRANT SELECT ON SEQUENCE %s", t.Derived("id_seq"))
	grant(PartRelay, "reads the shard layout; layout_released and layout_locked update it; switch_layout inserts or updates it",
		"GRANT SELECT, INSERT, UPDATE ON TABLE %s", t.Derived("relay_layout"))
	grant(PartRelay, "snapshot tracking: creates, reads, advances, splits and merges the cursor rows; takes the table's SHARE ROW EXCLUSIVE lock (LOCK TABLE needs UPDATE or DELETE)",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s", t.Derived("relay_cursor"))
	grant(PartRelay, "snapshot tracking: parks failed events and their aggregates' later ones, retries, records and deletes them",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s", t.Derived("parked"))
	grant(PartRelay, "snapshot tracking records the events it dead-lettered; replays leave them out",
		"GRANT SELECT, INSERT ON TABLE %s", t.Derived("dead_lettered"))
	grant(PartRelay, "replays leave out the events dropped by hand",
		"GRANT SELECT ON TABLE %s", t.Derived("skips"))
	grant(PartRelay, "looks for replays, claims one, records its progress and its end",
		"GRANT SELECT, UPDATE ON TABLE %s", t.Derived("replays"))
	grant(PartRelay, "with --notify: _relay_wait and _relay_woke read, insert, update and delete the waiting relays' claims",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE %s", t.Derived("relay_waiting"))
	grant(PartRelay, "with --notify: _relay_wait and _relay_woke setval the latest claim's expiry (setval needs UPDATE)",
		"GRANT UPDATE ON SEQUENCE %s", t.Derived("wake_until"))
	executes(PartRelay)

	// The writer.
	grant(PartWriter, "outbox.Append inserts these columns; every other column takes its default (the relay's columns, the id, the transaction id)",
		"GRANT INSERT (event_id, aggregate_type, aggregate_id, event_type, payload, payload_bytes, headers) ON TABLE %s", t.Ident())
	grant(PartWriter, "the id column's default draws from it (nextval)",
		"GRANT USAGE ON SEQUENCE %s", t.Derived("id_seq"))
	grant(PartWriter, "with the insert trigger (notify mode): <table>_wake_wanted(), its WHEN condition, reads it",
		"GRANT SELECT ON SEQUENCE %s", t.Derived("wake_until"))
	executes(PartWriter)

	// The consumer.
	inbox := pgx.Identifier{t.Schema, "inbox"}.Sanitize()
	grant(PartConsumer, "inbox.Process records the event's id", "GRANT INSERT (event_id, topic, processed_at) ON TABLE %s", inbox)
	grant(PartConsumer, "ON CONFLICT (event_id) DO NOTHING reads the conflict target", "GRANT SELECT (event_id) ON TABLE %s", inbox)

	// The reader.
	for _, obj := range []struct{ what, name, why string }{
		{"TABLE", t.Ident(), "events, status (blocked aggregates, backlog), published, replay --dry-run"},
		{"TABLE", t.Derived("schema_version"), "the schema version every command checks first"},
		{"SEQUENCE", t.Derived("id_seq"), "the snapshot backlog reads the id sequence's value"},
		{"TABLE", t.Derived("relay_layout"), "status: the shard layout"},
		{"TABLE", t.Derived("relay_cursor"), "status, cursor: the snapshot cursor (and which tracking the table runs)"},
		{"TABLE", t.Derived("relay_cursor_resets"), "the record of cursor resets"},
		{"TABLE", t.Derived("parked"), "status: parked aggregates; events"},
		{"TABLE", t.Derived("dead_lettered"), "events, published"},
		{"TABLE", t.Derived("skips"), "status, events: events skipped by hand"},
		{"TABLE", t.Derived("retries"), "the record of retries by hand"},
		{"TABLE", t.Derived("replays"), "status, replay --list: replays and their progress"},
	} {
		grant(PartReader, obj.why, "GRANT SELECT ON %s %s", obj.what, obj.name)
	}
	if role, ok := roles[PartReader]; ok {
		add(PartReader, ByOwner, "status reads each partition itself (<table>_partitions() and the default partition's pending rows): the partitions that exist now",
			"DO $grants$ DECLARE p regclass; BEGIN FOR p IN SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = %s::regclass LOOP "+
				"EXECUTE format('GRANT SELECT ON TABLE %%s TO %%s', p, %s); END LOOP; END $grants$",
			QuoteLiteral(t.Ident()), QuoteLiteral(q(role)))
		add(PartReader, ByOwner, "the daily partitions the owner creates later (and any table a later migration adds to the schema)",
			"ALTER DEFAULT PRIVILEGES FOR ROLE %s IN SCHEMA %s GRANT SELECT ON TABLES TO %s", owner, schema, q(role))
	}

	executes(PartReader)
	return out, nil
}

// GrantSQL renders the privileges script of t for roles r: the administrator's part, to run once
// before the first migration, then the owner's part, to run after the migrations and again after
// every upgrade (every statement may run again). Each statement follows a comment saying why.
func GrantSQL(t Table, r Roles) (string, error) {
	ps, err := Privileges(t, r)
	if err != nil {
		return "", err
	}
	return render(t, r, ps, true), nil
}

// OwnerGrantSQL renders only the owner's part of the script (see GrantSQL): the statements the
// owner role may run itself, for instance after each upgrade of the schema.
func OwnerGrantSQL(t Table, r Roles) (string, error) {
	ps, err := Privileges(t, r)
	if err != nil {
		return "", err
	}
	return render(t, r, ps, false), nil
}

func render(t Table, r Roles, ps []Privilege, admin bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "-- Privileges of the outbox table %s at schema version %d (docs/privileges.md).\n", t, LatestVersion())
	fmt.Fprintf(&b, "-- Roles: owner %s", r.Owner)
	for _, p := range []struct{ part, name string }{{PartRelay, r.Relay}, {PartWriter, r.Writer}, {PartConsumer, r.Consumer}, {PartReader, r.Reader}} {
		switch p.name {
		case "":
		case r.Owner:
			fmt.Fprintf(&b, ", %s the owner", p.part)
		default:
			fmt.Fprintf(&b, ", %s %s", p.part, p.name)
		}
	}
	b.WriteString(". None needs SUPERUSER, REPLICATION, CREATEDB, CREATEROLE or BYPASSRLS.\n")
	section, lastWhy := "", ""
	for _, p := range ps {
		if p.By == ByAdmin && !admin {
			continue
		}
		if p.By != section {
			section = p.By
			if p.By == ByAdmin {
				b.WriteString("\n-- 1. As a database administrator, connected to the table's database, once before the first migration.\n" +
					"--    Create the login roles first, e.g. CREATE ROLE name LOGIN PASSWORD '...'.\n")
			} else {
				step := "2. "
				if !admin {
					step = ""
				}
				fmt.Fprintf(&b, "\n-- %sAs the owner %s (or the administrator), after the migrations (outboxdb.Apply, relay migrate,\n"+
					"-- the operator) and again after every upgrade: every statement may run again.\n", step, r.Owner)
			}
		}
		if why := p.Part + ": " + p.Why; why != lastWhy {
			fmt.Fprintf(&b, "-- %s\n", why)
			lastWhy = why
		}
		b.WriteString(p.SQL + "\n")
	}
	return b.String()
}

// RelayGrants returns the owner's statements that give role relay what a relay needs on t's
// objects: the relay's share of the owner's part of the script (OwnerGrantSQL). The operator runs
// them as the owner after the migrations, and again after each schema upgrade, when the relays
// connect as a role of their own (spec.relay.databaseSecretRef). They only grant: PUBLIC's
// defaults and the other parts' grants stay as they are (the owner's part of GrantSQL revokes
// PUBLIC's). The administrator's statements for the relay (USAGE on the public schema, CONNECT,
// pg_read_all_stats for --wait-for-standbys) are not among them.
func RelayGrants(t Table, owner, relay string) ([]string, error) {
	if relay == "" {
		return nil, fmt.Errorf("relay role: %w", ErrInvalidRole)
	}
	ps, err := Privileges(t, Roles{Owner: owner, Relay: relay})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, p := range ps {
		if p.Part == PartRelay && p.By == ByOwner {
			out = append(out, p.SQL)
		}
	}
	return out, nil
}

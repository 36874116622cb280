package outboxdb_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outbox-operator/outbox-operator/inbox"
	"github.com/outbox-operator/outbox-operator/outbox"
	"github.com/outbox-operator/outbox-operator/outboxdb"
	"github.com/outbox-operator/outbox-operator/test/pgtest"
	"github.com/outbox-operator/outbox-operator/test/roletest"
)

var shopTable = outboxdb.MustParseTable("shop.outbox")

// TestGrantSQLRoles: the script's shape for the roles given.
func TestGrantSQLRoles(t *testing.T) {
	for _, bad := range []outboxdb.Roles{
		{},
		{Owner: "public"},
		{Owner: "o", Relay: "CURRENT_USER"},
		{Owner: "o", Writer: "pg_monitor"},
		{Owner: "o", Reader: "x$y"},
		{Owner: "o\nDROP TABLE t; --"},
		{Owner: strings.Repeat("o", 64)},
	} {
		if _, err := outboxdb.GrantSQL(shopTable, bad); !errors.Is(err, outboxdb.ErrInvalidRole) {
			t.Errorf("GrantSQL(%+v): %v, want ErrInvalidRole", bad, err)
		}
	}
	if _, err := outboxdb.GrantSQL(outboxdb.Table{Schema: "shop", Name: "Bad"}, outboxdb.Roles{Owner: "o"}); !errors.Is(err, outboxdb.ErrInvalidTable) {
		t.Errorf("invalid table: %v", err)
	}

	all, err := outboxdb.GrantSQL(shopTable, outboxdb.Roles{Owner: "o", Relay: "r", Writer: "w", Consumer: "c", Reader: `we"ird`})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`CREATE SCHEMA IF NOT EXISTS "shop" AUTHORIZATION "o";`,
		`GRANT pg_read_all_stats TO "o";`,
		`'"o", "r", "w", "c", "we""ird"'`,
		`GRANT UPDATE ON SEQUENCE "shop"."outbox_wake_until" TO "r";`,
		`GRANT INSERT (event_id, aggregate_type, aggregate_id, event_type, payload, payload_bytes, headers) ON TABLE "shop"."outbox" TO "w";`,
		`GRANT SELECT (event_id) ON TABLE "shop"."inbox" TO "c";`,
		`ALTER DEFAULT PRIVILEGES FOR ROLE "o" IN SCHEMA "shop" GRANT SELECT ON TABLES TO "we""ird";`,
	} {
		if !strings.Contains(all, want) {
			t.Errorf("GrantSQL lacks %s:\n%s", want, all)
		}
	}
	for _, bad := range []string{"SUPERUSER;", "REPLICATION;", "CREATEDB;", "pg_monitor", "pg_signal_backend", "TRUNCATE", " ALL ON TABLE", "TO PUBLIC"} {
		if strings.Contains(all, bad) {
			t.Errorf("GrantSQL contains %q", bad)
		}
	}

	// The owner's part alone: nothing an administrator must run.
	own, err := outboxdb.OwnerGrantSQL(shopTable, outboxdb.Roles{Owner: "o", Relay: "r"})
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"CREATE SCHEMA", "DATABASE", "pg_read_all_stats", `TO "w"`} {
		if strings.Contains(own, bad) {
			t.Errorf("OwnerGrantSQL contains %q:\n%s", bad, own)
		}
	}

	// One role for the operator and the relays (the operator's deployment today): the relay needs
	// no grant, the writer still does.
	one, err := outboxdb.Privileges(outboxdb.MustParseTable("outbox"), outboxdb.Roles{Owner: "op", Relay: "op", Writer: "app"})
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]int{}
	for _, p := range one {
		parts[p.Part]++
		if p.Part == outboxdb.PartOwner && p.By != outboxdb.ByAdmin || !strings.HasSuffix(p.SQL, ";") {
			t.Errorf("statement %+v", p)
		}
	}
	if parts[outboxdb.PartRelay] != 0 || parts[outboxdb.PartWriter] == 0 || parts[outboxdb.PartReader] != 0 {
		t.Errorf("statements per part %v: want none for the relay (the owner) and the reader (none given)", parts)
	}
	if s, _ := outboxdb.GrantSQL(outboxdb.MustParseTable("outbox"), outboxdb.Roles{Owner: "op"}); !strings.Contains(s, `GRANT USAGE, CREATE ON SCHEMA public TO "op";`) {
		t.Errorf("public schema: the owner needs CREATE on it:\n%s", s)
	}
}

var revokedFunction = regexp.MustCompile(`(?m)^REVOKE ALL ON FUNCTION (.+) FROM PUBLIC;$`)

// TestGrantsCoverSchema: every function, table and sequence the migrations create is named by
// the script, so that a migration adding one must decide who gets it (the function list in
// grants.go, and docs/privileges.md).
func TestGrantsCoverSchema(t *testing.T) {
	db, _ := openDB(t)
	ctx := context.Background()
	if _, err := outboxdb.Apply(ctx, db, shopTable); err != nil {
		t.Fatal(err)
	}
	script, err := outboxdb.GrantSQL(shopTable, outboxdb.Roles{Owner: "o", Relay: "r", Writer: "w", Consumer: "c", Reader: "rd"})
	if err != nil {
		t.Fatal(err)
	}
	named := map[uint32]string{}
	for _, m := range revokedFunction.FindAllStringSubmatch(script, -1) {
		var oid uint32
		if err := db.QueryRowContext(ctx, `SELECT $1::regprocedure::oid`, m[1]).Scan(&oid); err != nil {
			t.Errorf("the script names %s, which the schema does not have: %v", m[1], err)
			continue
		}
		named[oid] = m[1]
	}
	rows, err := db.QueryContext(ctx, `SELECT p.oid, p.oid::regprocedure::text FROM pg_proc p
WHERE p.pronamespace = 'shop'::regnamespace AND p.proname LIKE 'outbox\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var (
			oid uint32
			sig string
		)
		if err := rows.Scan(&oid, &sig); err != nil {
			t.Fatal(err)
		}
		n++
		if _, ok := named[oid]; !ok {
			t.Errorf("function %s is not in the script (grants.go, functions)", sig)
		}
	}
	if n != len(named) || n < 20 {
		t.Errorf("%d functions in the schema, %d in the script", n, len(named))
	}

	// Tables and sequences, but the partitions (granted to the reader by a loop and by default
	// privileges) and the sequences of identity columns (which need no privilege of their own).
	rels, err := db.QueryContext(ctx, `SELECT c.relname::text, c.relkind::text FROM pg_class c
WHERE c.relnamespace = 'shop'::regnamespace AND c.relkind IN ('r', 'p', 'S')
  AND NOT c.relispartition
  AND NOT (c.relkind = 'S' AND EXISTS (SELECT 1 FROM pg_depend d
    WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid AND d.refclassid = 'pg_class'::regclass AND d.deptype = 'i'))
ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	defer rels.Close()
	var seen []string
	for rels.Next() {
		var name, kind string
		if err := rels.Scan(&name, &kind); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, name)
		if !strings.Contains(script, `"shop"."`+name+`"`) {
			t.Errorf("%s %s is not in the script", map[string]string{"r": "table", "p": "table", "S": "sequence"}[kind], name)
		}
	}
	t.Logf("%d functions and %d tables and sequences: %s", n, len(seen), strings.Join(seen, ", "))
}

// permissionDenied fails the test unless err is PostgreSQL's insufficient_privilege on object.
func permissionDenied(t *testing.T, what string, err error, object string) {
	t.Helper()
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" || !strings.Contains(pgErr.Message, object) {
		t.Errorf("%s: %v; want permission denied for %s (42501)", what, err, object)
		return
	}
	t.Logf("%s without its grant: %s", what, pgErr.Message)
}

// TestLeastPrivilegeParts runs every part but the relay (relay/privileges_test.go) as a role
// holding only the script's grants: the owner migrates, keeps the partitions, switches the
// wake-ups and acts by hand; a writer appends with the trigger notifying a waiting relay's role;
// a consumer dedupes; a reader reads what kubectl outbox status reads. Then, for each role, one
// grant taken away makes its step fail with PostgreSQL's permission error.
func TestLeastPrivilegeParts(t *testing.T) {
	ctx := context.Background()
	d := roletest.New(t, shopTable, nil)
	d.Migrate(t, 1)
	d.CheckRoles(t)
	r := d.Roles
	owner := d.SQL(t, r.Owner)

	// PUBLIC holds nothing on the table's objects.
	var public string
	if err := d.SQL(t, roletest.Admin).QueryRowContext(ctx, `SELECT coalesce(string_agg(what, ', ' ORDER BY what), '') FROM (
  SELECT p.oid::regprocedure::text AS what FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
   WHERE p.pronamespace = 'shop'::regnamespace AND a.grantee = 0
  UNION ALL
  SELECT c.oid::regclass::text FROM pg_class c, aclexplode(c.relacl) a WHERE c.relnamespace = 'shop'::regnamespace AND a.grantee = 0) x`).
		Scan(&public); err != nil {
		t.Fatal(err)
	}
	if public != "" {
		t.Errorf("PUBLIC holds privileges on %s", public)
	}

	// What the parts call of PostgreSQL's own functions needs no grant: the snapshot cursor's
	// identity check (pg_control_system) is PUBLIC's on every supported version.
	var acl string
	var callable bool
	if err := d.SQL(t, roletest.Admin).QueryRowContext(ctx, `SELECT coalesce(proacl::text, 'default (EXECUTE to PUBLIC)'),
  has_function_privilege($1, 'pg_control_system()', 'EXECUTE') FROM pg_proc WHERE proname = 'pg_control_system'`, r.Relay).Scan(&acl, &callable); err != nil {
		t.Fatal(err)
	}
	if !callable {
		t.Errorf("the relay's role cannot call pg_control_system() (ACL %s)", acl)
	}
	t.Logf("PostgreSQL %d: pg_control_system() ACL %s", pgtest.Shared(t).VersionNum/10000, acl)

	// The owner: partitions created, listed and dropped past retention; the trigger dropped and
	// created again.
	today := time.Now().UTC().Truncate(24 * time.Hour)
	created, err := outboxdb.EnsurePartitions(ctx, owner, shopTable, today.AddDate(0, 0, -10), today.AddDate(0, 0, -9))
	if err != nil || len(created) != 2 {
		t.Fatalf("EnsurePartitions as the owner: %v %v", created, err)
	}
	pruned, err := outboxdb.PrunePartitions(ctx, owner, shopTable, 48*time.Hour)
	if err != nil || len(pruned.Dropped) != 2 {
		t.Fatalf("PrunePartitions as the owner: %+v %v", pruned, err)
	}
	for _, on := range []bool{false, true} {
		if _, err := outboxdb.SetNotify(ctx, owner, shopTable, on, 2*time.Second); err != nil {
			t.Fatalf("SetNotify(%v) as the owner: %v", on, err)
		}
	}

	// A relay's role claims a wait and listens; the writer's insert notifies it.
	relayConn, err := pgx.Connect(ctx, d.URL(r.Relay))
	if err != nil {
		t.Fatal(err)
	}
	defer relayConn.Close(ctx)
	wake := outboxdb.WakeStatements(shopTable)
	if _, err := relayConn.Exec(ctx, "LISTEN "+pgx.Identifier{shopTable.Channel()}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	if _, err := relayConn.Exec(ctx, wake.Wait, 30.0, nil); err != nil {
		t.Fatalf("the relay's role claims a wait: %v", err)
	}
	w, err := outbox.New(shopTable.String())
	if err != nil {
		t.Fatal(err)
	}
	writer := d.Pool(t, r.Writer)
	appendOne := func(agg string) error {
		return pgx.BeginFunc(ctx, writer, func(tx pgx.Tx) error {
			_, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: agg, EventType: "Created", Payload: []byte(`{"n":1}`)})
			return err
		})
	}
	if err := appendOne("a-1"); err != nil {
		t.Fatalf("outbox.Append as the writer: %v", err)
	}
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	n, err := relayConn.WaitForNotification(nctx)
	cancel()
	if err != nil || n.Channel != shopTable.Channel() {
		t.Fatalf("the writer's insert did not notify the waiting relay: %v %v", n, err)
	}
	if _, err := relayConn.Exec(ctx, wake.Woke); err != nil {
		t.Fatalf("the relay's role ends its claim: %v", err)
	}
	for i := range 3 {
		if err := appendOne("a-" + string(rune('2'+i))); err != nil {
			t.Fatal(err)
		}
	}
	// A writer cannot set the columns the relays and the schema own.
	_, err = writer.Exec(ctx, `INSERT INTO shop.outbox (aggregate_type, aggregate_id, event_type, payload, sent_at) VALUES ('order', 'x', 'X', '{}', now())`)
	permissionDenied(t, "a writer setting sent_at", err, "table outbox")
	_, err = writer.Exec(ctx, `UPDATE shop.outbox SET attempts = 0`)
	permissionDenied(t, "a writer updating the outbox", err, "table outbox")

	// The consumer.
	in, err := inbox.New("shop.inbox")
	if err != nil {
		t.Fatal(err)
	}
	consumer := d.Pool(t, r.Consumer)
	msg := inbox.Message{EventID: "6f1c1bde-6d4f-4e55-9a55-6a3c2b1f0a11", Topic: "orders"}
	for i, want := range []bool{true, false} {
		done, err := in.Process(ctx, consumer, msg, func(context.Context, pgx.Tx) error { return nil })
		if err != nil || done != want {
			t.Fatalf("inbox.Process #%d as the consumer: %v %v, want %v", i+1, done, err, want)
		}
	}

	// The owner acts by hand: a retry, a skip, a replay request.
	var firstID int64
	if err := owner.QueryRowContext(ctx, `SELECT min(id) FROM shop.outbox`).Scan(&firstID); err != nil {
		t.Fatal(err)
	}
	if _, err := owner.ExecContext(ctx, `UPDATE shop.outbox SET attempts = 2, error = 'refused' WHERE id = $1`, firstID); err != nil {
		t.Fatal(err)
	}
	if _, err := outboxdb.RetryAggregate(ctx, owner, shopTable, "a-1", "jane"); err != nil {
		t.Fatalf("RetryAggregate as the owner: %v", err)
	}
	if _, err := outboxdb.SkipEvent(ctx, owner, shopTable, firstID, outboxdb.SkipDrop, "jane", "test"); err != nil {
		t.Fatalf("SkipEvent as the owner: %v", err)
	}
	if _, err := owner.ExecContext(ctx, `UPDATE shop.outbox SET sent_at = now() WHERE aggregate_id = 'a-2'`); err != nil {
		t.Fatal(err)
	}
	ownerConn, err := pgx.Connect(ctx, d.URL(r.Owner))
	if err != nil {
		t.Fatal(err)
	}
	defer ownerConn.Close(ctx)
	if _, _, err := outboxdb.RequestReplay(ctx, ownerConn, shopTable, outboxdb.ReplayRequest{
		From: outboxdb.Bound{ID: firstID}, Reason: "test", RequestedBy: "jane"}); err != nil {
		t.Fatalf("RequestReplay as the owner: %v", err)
	}

	// The reader reads what status reads.
	reader := d.SQL(t, r.Reader)
	readAll := func() error {
		if _, err := outboxdb.CurrentVersion(ctx, reader, shopTable); err != nil {
			return err
		}
		if _, err := outboxdb.ReadLayout(ctx, reader, shopTable); err != nil {
			return err
		}
		if _, err := outboxdb.ReadRelayLocks(ctx, reader, shopTable); err != nil {
			return err
		}
		if _, err := outboxdb.ReadCursor(ctx, reader, shopTable); err != nil {
			return err
		}
		parts, err := outboxdb.ListPartitions(ctx, reader, shopTable)
		if err != nil {
			return err
		}
		if len(parts) < 3 {
			return errors.New("too few partitions")
		}
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{outboxdb.BacklogSQL(shopTable, false), outboxdb.BacklogArgs(nil, 1000)},
			{outboxdb.SnapshotBacklogSQL(shopTable, false), outboxdb.BacklogArgs(nil, 1000)},
			{outboxdb.ScalableLagSQL(shopTable), []any{1000}},
			{outboxdb.ParkedCountSQL(shopTable), nil},
			{`SELECT shop.outbox_pending()`, nil},
			{`SELECT shop.outbox_published($1)`, []any{firstID}},
			{`SELECT shop.outbox_notifies()`, nil},
			{`SELECT count(*) FROM shop.outbox_skips`, nil},
			{`SELECT count(*) FROM shop.outbox_retries`, nil},
			{`SELECT count(*) FROM shop.outbox_relay_cursor_resets`, nil},
			{`SELECT count(*) FROM shop.outbox_dead_lettered`, nil},
		} {
			rows, err := reader.QueryContext(ctx, q.sql, q.args...)
			if err != nil {
				return err
			}
			rows.Close()
		}
		rconn, err := pgx.Connect(ctx, d.URL(r.Reader))
		if err != nil {
			return err
		}
		defer rconn.Close(ctx)
		if _, err := outboxdb.ListReplays(ctx, rconn, shopTable, false, 10); err != nil {
			return err
		}
		_, err = outboxdb.PlanReplay(ctx, rconn, shopTable, outboxdb.ReplayRequest{From: outboxdb.Bound{ID: firstID}, Reason: "dry run", RequestedBy: "jane"})
		return err
	}
	if err := readAll(); err != nil {
		t.Fatalf("the reader's reads: %v", err)
	}
	var pending int
	if err := reader.QueryRowContext(ctx, `SELECT shop.outbox_pending()`).Scan(&pending); err != nil || pending != 2 {
		t.Errorf("outbox_pending() as the reader: %d %v, want 2 (a-3, a-4)", pending, err)
	}
	_, err = reader.ExecContext(ctx, `UPDATE shop.outbox SET sent_at = now()`)
	permissionDenied(t, "a reader updating the outbox", err, "table outbox")
	// A partition the owner creates later is readable through the default privileges.
	if _, err := outboxdb.EnsurePartitions(ctx, owner, shopTable, today.AddDate(0, 0, 2), today.AddDate(0, 0, 2)); err != nil {
		t.Fatal(err)
	}
	if err := readAll(); err != nil {
		t.Fatalf("the reader's reads after a new partition: %v", err)
	}

	// One grant taken away per role: its step fails with PostgreSQL's permission error.
	regrant := func() { d.GrantAsOwner(t) }
	d.Exec(t, r.Owner, `REVOKE EXECUTE ON FUNCTION shop.outbox_wake_wanted() FROM `+pgx.Identifier{r.Writer}.Sanitize())
	permissionDenied(t, "outbox.Append with the insert trigger", appendOne("b-1"), "function outbox_wake_wanted")
	regrant()
	d.Exec(t, r.Owner, `REVOKE USAGE ON SEQUENCE shop.outbox_id_seq FROM `+pgx.Identifier{r.Writer}.Sanitize())
	permissionDenied(t, "outbox.Append", appendOne("b-1"), "sequence outbox_id_seq")
	regrant()
	if err := appendOne("b-1"); err != nil {
		t.Fatalf("outbox.Append after the grants were run again: %v", err)
	}

	d.Exec(t, r.Owner, `REVOKE SELECT (event_id) ON shop.inbox FROM `+pgx.Identifier{r.Consumer}.Sanitize())
	_, err = in.Process(ctx, consumer, inbox.Message{EventID: "7f1c1bde-6d4f-4e55-9a55-6a3c2b1f0a11"}, func(context.Context, pgx.Tx) error { return nil })
	permissionDenied(t, "inbox.Process", err, "table inbox")
	regrant()

	d.Exec(t, r.Owner, `REVOKE UPDATE ON SEQUENCE shop.outbox_wake_until FROM `+pgx.Identifier{r.Relay}.Sanitize())
	_, err = relayConn.Exec(ctx, wake.Wait, 30.0, nil)
	permissionDenied(t, "the relay's claim (_relay_wait)", err, "sequence outbox_wake_until")
	regrant()
	if _, err := relayConn.Exec(ctx, wake.Wait, 30.0, nil); err != nil {
		t.Fatalf("the relay's claim after the grants were run again: %v", err)
	}

	part := shopTable.Name + "_p" + today.Format("20060102")
	d.Exec(t, r.Owner, `REVOKE SELECT ON shop.`+part+` FROM `+pgx.Identifier{r.Reader}.Sanitize())
	_, err = outboxdb.ListPartitions(ctx, reader, shopTable)
	permissionDenied(t, "the reader listing the partitions", err, "table "+part)
	regrant()

	// The owner needs no CREATE on the database: outboxdb.Apply creates no schema that exists
	// (PostgreSQL checks that privilege for CREATE SCHEMA IF NOT EXISTS even then).
	var canCreate bool
	if err := owner.QueryRowContext(ctx, `SELECT has_database_privilege(current_database(), 'CREATE')`).Scan(&canCreate); err != nil {
		t.Fatal(err)
	}
	if canCreate {
		t.Error("the owner holds CREATE on the database: the script grants more than Apply needs")
	}
	if _, err := outboxdb.Apply(ctx, owner, shopTable); err != nil {
		t.Errorf("outboxdb.Apply again as the owner, without CREATE on the database: %v", err)
	}

	// Without pg_read_all_stats the owner's retention check cannot see when another role's
	// transaction began (snapshot tracking: a cursor exists).
	if _, err := outboxdb.ResetCursor(ctx, owner, shopTable, outboxdb.ResetToNow, "test"); err != nil {
		t.Fatalf("ResetCursor as the owner: %v", err)
	}
	tx, err := writer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	after := time.Now()
	time.Sleep(100 * time.Millisecond)
	empty := shopTable.Name + "_p" + today.AddDate(0, 0, 2).Format("20060102")
	var writerPID int32
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&writerPID); err != nil {
		t.Fatal(err)
	}
	// sees reports whether the owner sees when the writer's transaction began, and what the
	// retention check says of an empty partition whose day ended after that.
	sees := func() (started, pending bool) {
		t.Helper()
		if err := owner.QueryRowContext(ctx, `SELECT xact_start IS NOT NULL FROM pg_stat_activity WHERE pid = $1`, writerPID).Scan(&started); err != nil {
			t.Fatal(err)
		}
		if err := owner.QueryRowContext(ctx, `SELECT shop.outbox_partition_has_pending($1, $2)`, empty, after).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		return started, pending
	}
	if started, pending := sees(); !started || !pending {
		t.Errorf("with pg_read_all_stats the owner does not see the writer's transaction (start seen %v, partition kept %v)", started, pending)
	}
	d.Exec(t, roletest.Admin, `REVOKE pg_read_all_stats FROM `+pgx.Identifier{r.Owner}.Sanitize())
	owner.SetMaxIdleConns(0) // new sessions, without the membership
	if started, pending := sees(); started || pending {
		t.Errorf("without pg_read_all_stats the owner still sees the writer's transaction (start seen %v, partition kept %v): then the script need not grant it", started, pending)
	} else {
		t.Logf("without pg_read_all_stats the owner's retention check does not see another role's open transaction")
	}
}

// TestLeastPrivilegePublicSchema: the default table, public.outbox, where the owner role owns no
// schema and is granted CREATE on public (which PostgreSQL 15 and later keep for the database's
// owner; this test revokes PUBLIC's on 13 and 14 too).
func TestLeastPrivilegePublicSchema(t *testing.T) {
	ctx := context.Background()
	table := outboxdb.MustParseTable("public.outbox")
	d := roletest.New(t, table, nil)
	d.Migrate(t, 1)
	d.CheckRoles(t)
	w, err := outbox.New(table.String())
	if err != nil {
		t.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, d.Pool(t, d.Roles.Writer), func(tx pgx.Tx) error {
		_, err := w.Append(ctx, tx, outbox.Event{AggregateType: "order", AggregateID: "a", EventType: "Created", Payload: []byte(`{}`)})
		return err
	}); err != nil {
		t.Fatalf("outbox.Append as the writer: %v", err)
	}
	parts, err := outboxdb.ListPartitions(ctx, d.SQL(t, d.Roles.Reader), table)
	if err != nil || len(parts) < 3 {
		t.Fatalf("ListPartitions as the reader: %v %v", parts, err)
	}
	var pending int
	if err := d.SQL(t, d.Roles.Reader).QueryRowContext(ctx, `SELECT public.outbox_pending()`).Scan(&pending); err != nil || pending != 1 {
		t.Fatalf("outbox_pending() as the reader: %d %v", pending, err)
	}
}

// TestGrantSQLWaitForStandbys: only relays that wait for the standbys get pg_read_all_stats.
func TestGrantSQLWaitForStandbys(t *testing.T) {
	for _, wait := range []bool{false, true} {
		script, err := outboxdb.GrantSQL(shopTable, outboxdb.Roles{Owner: "o", Relay: "r", WaitForStandbys: wait})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(script, `GRANT pg_read_all_stats TO "r"`); got != wait {
			t.Errorf("waitForStandbys %v: the relay role granted pg_read_all_stats: %v\n%s", wait, got, script)
		}
	}
}

// TestRelayGrants: the statements the operator runs as the owner for a relay role of its own are
// the relay's share of the owner's part of the script, and only grants to that role.
func TestRelayGrants(t *testing.T) {
	table := outboxdb.MustParseTable("shop.outbox")
	got, err := outboxdb.RelayGrants(table, "shop_owner", "shop_relay")
	if err != nil {
		t.Fatal(err)
	}
	owner, err := outboxdb.OwnerGrantSQL(table, outboxdb.Roles{Owner: "shop_owner", Relay: "shop_relay"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 10 {
		t.Fatalf("%d statements, want the relay's every grant: %q", len(got), got)
	}
	for _, s := range got {
		if !strings.HasPrefix(s, "GRANT ") || !strings.HasSuffix(s, ` TO "shop_relay";`) {
			t.Errorf("not a grant to the relay role: %s", s)
		}
		if !strings.Contains(owner, s) {
			t.Errorf("not in the owner's part of the script: %s", s)
		}
	}
	for _, want := range []string{`GRANT USAGE ON SCHEMA "shop" TO "shop_relay";`, `GRANT SELECT ON TABLE "shop"."outbox" TO "shop_relay";`,
		`GRANT SELECT, INSERT, UPDATE, DELETE ON TABLE "shop"."outbox_relay_cursor" TO "shop_relay";`} {
		if !slices.Contains(got, want) {
			t.Errorf("missing %s", want)
		}
	}
	if same, err := outboxdb.RelayGrants(table, "shop_owner", "shop_owner"); err != nil || len(same) != 0 {
		t.Errorf("relays running as the owner: %q (%v), want nothing to grant", same, err)
	}
	for _, bad := range []string{"", "public", "pg_monitor"} {
		if _, err := outboxdb.RelayGrants(table, "shop_owner", bad); !errors.Is(err, outboxdb.ErrInvalidRole) {
			t.Errorf("relay role %q: %v, want ErrInvalidRole", bad, err)
		}
	}
}

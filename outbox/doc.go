// Package outbox writes events into a transactional outbox table, in the caller's own
// PostgreSQL transaction, for an outbox-operator relay to publish to Kafka.
//
// An application creates one Writer per outbox table and appends its events in the same
// transaction as its business rows, so the event exists if and only if the business change
// committed:
//
//	w, err := outbox.New("public.outbox")
//	...
//	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if _, err := tx.Exec(ctx, "INSERT INTO orders ...", ...); err != nil {
//			return err
//		}
//		_, err := w.Append(ctx, tx, outbox.Event{
//			AggregateType: "order", AggregateID: orderID, EventType: "OrderCreated", Payload: payload,
//		})
//		return err
//	})
//
// The schema (table, partitions, inbox, and the insert trigger where the relays are woken by
// notifications) is created by the migrations package, which the operator and `relay migrate`
// apply; this package only inserts rows. It depends on pgx only. Appending is the same whatever
// the relays' tracking mode: by default (Snapshot) they never update an event row; under Row
// they mark each published row sent.
//
// # Bad events
//
// Append and AppendBatch refuse an event with an empty aggregate type, aggregate id or event
// type, or headers that are not a JSON object, before anything is sent (an error, the
// transaction untouched); the SQL appends below refuse the same events in the database
// (SQLSTATE 23514, check_violation). A new table has no CHECKs for them (outboxdb.NewTableChecks:
// every insert is cheaper), so a plain INSERT of such an event is accepted and the relays deal
// with it as poison (parked or dead-lettered by the OutboxRelay's poison policy, never lost);
// spec.writers.checks: Table (relay checks set table) gives the table its CHECKs back, and
// PostgreSQL then refuses it at insert too.
//
// # Order per aggregate
//
// A relay publishes pending rows in id order. Ids come from a sequence, which hands them out
// when a row is inserted, not when its transaction commits: without care, a transaction that
// inserted first but commits last would have its event published after a later one of the same
// aggregate, or, if the relay already went past its id, not in order at all.
//
// Append and AppendBatch therefore take a transaction-scoped advisory lock per aggregate before
// they draw an id, in the same statement as the insert:
//
//	pg_advisory_xact_lock(hashtextextended('<schema>.<table>:' || aggregate_id, 0))
//
// A second transaction appending to the same aggregate waits until the first one commits or
// rolls back, so the ids of one aggregate are assigned in commit order. Writers in other
// languages get the same lock, with the same key, from the table's SQL append, one statement
// (migration 00018; README, "Writing from any language"):
//
//	SELECT <table>_append(aggregate_type, aggregate_id, event_type, payload::jsonb [, headers::jsonb [, event_id]])
//	SELECT <table>_append_bytes(aggregate_type, aggregate_id, event_type, payload::bytea [, headers::jsonb [, event_id]])
//
// The second takes a value the application encoded itself (Event.PayloadBytes in Go: Avro,
// Protobuf, a Schema Registry frame), or NULL for an event without a value (Event.Tombstone), a
// tombstone where the OutboxRelay's publish.nullPayload is Tombstone (migration 00020).
//
// A plain INSERT into the table takes no lock: its event is published, but two transactions of
// one aggregate that overlap may be published in id order rather than commit order. The lock is a single
// bigint key, a key space that never overlaps the relay's two-int4 bucket locks
// pg_advisory_lock(<table key>, bucket). Transactions appending to different aggregates do not
// wait for each other (except for the rare hash collision of two aggregate ids).
//
// Consequences an application should know about:
//
//   - The lock is held until the transaction ends. Keep transactions that append events short,
//     and append late in the transaction if it does slow work on the same aggregate.
//   - Two transactions that append to the same two aggregates in opposite orders deadlock;
//     PostgreSQL detects it after deadlock_timeout and aborts one of them with SQLSTATE 40P01
//     (deadlock_detected), which Append returns wrapped (test with IsDeadlock). Retry the
//     transaction, or append in a consistent order. AppendBatch takes its locks in sorted order
//     of the aggregate ids, once per distinct aggregate, so transactions that each append with
//     a single AppendBatch never deadlock with each other.
//   - Each distinct aggregate a transaction appends to holds one entry of PostgreSQL's shared
//     lock table until the transaction ends. The table is sized max_locks_per_transaction ×
//     (max_connections + max_prepared_transactions), 6,400 entries with the defaults (measured:
//     a transaction can take 10,000 advisory locks on a default server, not 20,000, and then
//     fails with "out of shared memory", as may other sessions meanwhile). Keep the distinct
//     aggregates of one transaction to a few thousand at most, or raise
//     max_locks_per_transaction.
//   - The lock costs a transaction a lock-table entry and a round of hashing (make bench, "write
//     path"). An application that already serialises the writers of an aggregate, by locking
//     the aggregate's own row (SELECT ... FOR UPDATE, or UPDATE it) before it appends, in every
//     transaction that appends its events, may skip it with WithoutAggregateLock.
//   - A transaction that will be prepared (PREPARE TRANSACTION, two-phase commit) calls
//     NoWakeUp before it appends: while a relay waits for a notification (spec.publish.notify),
//     the table's insert trigger notifies, and PostgreSQL refuses to prepare a transaction that
//     notified. Its events are published as usual, at the relays' next poll.
//   - Behind a pooler in transaction mode (PgBouncer's pool_mode = transaction) everything
//     works as it is: the lock is transaction-scoped, and Append and AppendBatch work in every
//     pgx query execution mode, the simple protocol included.
//   - Append accepts any Querier. Given a pool or a connection outside a transaction, each call
//     is its own transaction: ordering still holds, but the event is no longer atomic with the
//     caller's other writes, which defeats the purpose of an outbox.
//
// # Validation
//
// Every event is validated before anything is sent to PostgreSQL, so that a bad event never
// aborts the caller's transaction with a database error and never becomes a poison event at the
// relay: non-empty aggregate type, aggregate id and event type (valid UTF-8 without NUL bytes),
// a payload that is valid JSON which PostgreSQL's jsonb accepts (no \u0000, no lone UTF-16
// surrogates, numbers within numeric's range) or else PayloadBytes or Tombstone (exactly one of
// the three), a payload no larger than the writer's limit as the relay will read it back, header keys non-empty and not reserved (ReservedHeaders), a Kafka
// key and headers within MaxKeyAndHeadersBytes, and an optional EventID that is a UUID. Errors
// wrap one of the Err* sentinels (use errors.Is) inside an
// *InvalidEventError that carries the index of the offending event.
//
// # Size limit
//
// The limit (WithMaxPayloadBytes, default 900,000 bytes, below Kafka's default 1 MB message
// limit) applies to the payload as PostgreSQL renders the stored jsonb, which is what a relay
// reads back and publishes: jsonb adds a space after every ':' and ',', decodes \u escapes, and
// writes numbers in plain notation (1e6 becomes 1000000). The writer computes that length from
// the input without a round trip; see StoredPayloadSize.
//
// # Notifications
//
// By default the relays poll and the table has no trigger: appending costs the insert alone.
// Where the relays are woken by notifications instead (spec.publish.notify, `relay wakeups set
// notify`), the table has a statement-level AFTER INSERT trigger that notifies only while a relay
// waits, and PostgreSQL folds the identical notifications of one transaction into one: a
// transaction wakes the relay once when it commits, however many events it appended. AppendBatch
// inserts with a single INSERT statement (one round trip, not COPY).
package outbox

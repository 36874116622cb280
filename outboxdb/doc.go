// Package outboxdb is the outbox table's database protocol: everything the operator, the relay,
// the writer library's tests and the benchmark say to PostgreSQL about an outbox table, in one
// place, each part in the file that names it:
//
//   - migrations.go: the schema, the versioned SQL templates of migrations/ rendered and applied
//     with goose;
//   - partitions.go: the daily partitions, their upkeep and its defaults;
//   - layout.go: the shard layout and the relays' locks (resharding);
//   - backlog.go: the backlog and lag statistics;
//   - wake.go: wake-ups (the insert trigger, relays' claims);
//   - cursor.go: snapshot tracking's cursors.
//
// Its polling loops take a Clock, as the operator's reconciler does.
package outboxdb

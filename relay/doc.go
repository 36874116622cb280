// Package relay publishes the pending rows of one shard of an outbox table to Kafka and marks
// them sent once the broker acknowledged them: the engine behind the relay binary (cmd/relay).
// docs/architecture.md ("Shards and fencing", "The relay loop", "Relay command line") is the
// contract; this comment says how the package keeps it.
//
//	cfg := relay.DefaultConfig()
//	cfg.DatabaseURL, cfg.Kafka.Brokers, cfg.DefaultTopic = url, brokers, "events"
//	r, err := relay.New(cfg, relay.WithLogger(log))
//	...
//	err = r.Run(ctx) // until ctx ends; then finishes the batch in flight and releases its locks
//
// # Fencing
//
// Shard k of N owns the buckets b with b % N == k (OwnedBuckets). At start the relay opens its
// lock connection and takes pg_advisory_lock(table.LockKey(), b) for every owned bucket in
// ascending order, waiting on any another session holds (another relay of the same shard, or
// of another shard count whose buckets overlap); it is not ready until it holds them all.
// Fetch and mark run on that connection only, so a relay whose lock connection died cannot
// mark anything: on a connection error it stops publishing, reconnects with backoff and takes
// every lock again before it fetches. The lock connection asks for TCP keepalives on both ends
// (and client_connection_check_interval where PostgreSQL has it), so a vanished relay's locks
// are released within about half a minute. Session advisory locks need a session: a pooler in
// front of PostgreSQL must run in session mode.
//
// # The loop
//
// One iteration is one round trip on the lock connection, in one implicit transaction: it
// writes the outcome of the batch whose publication finished (sent_at for acknowledged rows;
// attempts and error for failed ones) and fetches the next batch (FOR UPDATE, ORDER BY id, the shard's buckets, excluding the rows in flight and the blocked aggregates).
// Meanwhile the batch fetched in the previous iteration is being published; the relay waits
// for its outcome, drops from the newly fetched batch the events of aggregates that just failed,
// and starts publishing it. So fetch and mark overlap with publishing, at most one batch is in
// flight, and batch N+1 goes out only after batch N's outcome is known. The relay loops at once
// while there is work and otherwise claims a wait, so that inserts notify (wake.go: inserts
// notify only while a relay holds such a claim, and the relay keeps fetching until every writer
// in progress at the claim has ended), and waits for a notification (LISTEN on table.Channel(),
// on a second connection that also refreshes the pending and lag gauges), the poll interval, or
// the end of an aggregate's backoff.
//
// Publishing uses kafka-go's produce requests directly (kafka_publisher.go): each message goes to
// the partition Murmur2Balancer (the Java client's partitioner; see testdata/murmur2_java.tsv)
// picks for its key among its topic's partitions, and the messages of one partition in one call
// go out, in order, as one record batch with RequireAll acks; the record batches of the
// partitions one broker leads travel in one produce request, the brokers' requests concurrently,
// and a partition that failed is retried on its own. A batch is written in calls that fit the
// byte budget of one request, so that all messages of one aggregate in one call travel in one
// record batch and succeed or fail together. Key =
// aggregate_id; headers event_id, event_type, aggregate_type, aggregate_id and the members of the
// row's headers object (reserved names dropped); the record's time is that of the call.
//
// # Failures
//
// An event the broker refuses blocks its aggregate (RetryBackoff, exponential with jitter):
// attempts+1 and error are recorded on its row, the aggregate's later events are skipped by the
// fetch until the backoff ends, and the aggregate is then retried with that event alone, so
// that the failure is charged to the event that causes it. Errors that say the broker could
// not be reached count no attempt; when every message of a batch fails that way the relay backs
// off as a whole (OutageBackoff) instead. Database failures back off the same way.
//
// Poison events (no topic for the aggregate type, payload over MaxPayloadBytes, headers that are
// not a JSON object, an empty aggregate type, aggregate id or event type (the table's CHECKs
// refuse those unless dropped: spec.writers.checks: Relay), or attempts >= MaxAttempts) follow
// PoisonPolicy: under PoisonBlock the aggregate stays blocked and the event
// is retried at the longest backoff, with attempts, error, outbox_poison_events_total and a log
// line (never the payload); under PoisonDeadLetter the event goes to the dead-letter topic with
// its headers plus "error" (and "original_topic" when known), and its row is marked sent with
// the error recorded. Nothing is dropped silently.
//
// # Delivery
//
// Rows are marked sent only after the broker acknowledged them, so a crash at any point
// republishes rather than loses. Duplicates come only from a crash (or a lost lock connection)
// between acknowledgement and mark, at most the two batches of the pipeline; SIGTERM finishes
// the batch in flight and marks it before the locks are released.
//
// # Observability
//
// Handler serves /metrics (the relay's own registry: outbox_pending, outbox_lag_seconds,
// outbox_published_total, outbox_publish_errors_total, outbox_poison_events_total,
// outbox_blocked_aggregates, outbox_shard_ready and outbox_worker_tick_duration_seconds, each
// labelled with shard and table, plus Go and process metrics), /healthz and /readyz. Logs are
// structured (log/slog); the database URL, its password and the SASL password never appear in
// a log line, an error column or an HTTP answer.
package relay

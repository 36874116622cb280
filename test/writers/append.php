<?php
// The SQL append from PHP (PDO, as the seed's Doctrine writer uses): run by test/writers
// (writers_test.go), which checks with an independent consumer that the events reach Kafka in
// commit order per aggregate.
//
//   php append.php WRITER AGGREGATES TRANSACTIONS   (database URL in OUTBOX_DATABASE_URL)
[$_, $writer, $aggregates, $transactions] = $argv;
$u = parse_url(getenv('OUTBOX_DATABASE_URL'));
$pdo = new PDO(sprintf('pgsql:host=%s;port=%d;dbname=%s', $u['host'], $u['port'], ltrim($u['path'], '/')),
    urldecode($u['user']), urldecode($u['pass'] ?? ''), [PDO::ATTR_ERRMODE => PDO::ERRMODE_EXCEPTION]);
$append = $pdo->prepare('SELECT outbox_append(?, ?, ?, ?::jsonb)');
$record = $pdo->prepare('WITH c AS (UPDATE counters SET n = n + 1 WHERE aggregate_id = ? RETURNING n)
    INSERT INTO commit_seq SELECT ?::uuid, ?, n FROM c');
for ($i = 0; $i < (int)$transactions; $i++) {
    $agg = 'agg-' . ($i % (int)$aggregates);
    $pdo->beginTransaction();
    // The append: one statement, the aggregate's lock taken before the id is drawn.
    $append->execute(['order', $agg, 'OrderPlaced', json_encode(['writer' => $writer, 'i' => $i])]);
    $eventId = $append->fetchColumn();
    // The test's record of commit order (the counter's row lock orders the commits).
    if ($i % 3 === 0) {
        $pdo->query('SELECT pg_sleep(0.001)');
    }
    $record->execute([$agg, $eventId, $agg]);
    $pdo->commit();
}

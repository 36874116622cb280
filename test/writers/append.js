// The SQL append from Node.js (node-postgres): run by test/writers (writers_test.go), which
// checks with an independent consumer that the events reach Kafka in commit order per aggregate.
//
//   node append.js WRITER AGGREGATES TRANSACTIONS   (database URL in OUTBOX_DATABASE_URL)
const { Client } = require('pg');

async function main() {
  const [writer, aggregates, transactions] = [process.argv[2], Number(process.argv[3]), Number(process.argv[4])];
  const client = new Client({ connectionString: process.env.OUTBOX_DATABASE_URL });
  await client.connect();
  try {
    for (let i = 0; i < transactions; i++) {
      const agg = `agg-${i % aggregates}`;
      await client.query('BEGIN');
      // The append: one statement, the aggregate's lock taken before the id is drawn.
      const { rows } = await client.query('SELECT outbox_append($1, $2, $3, $4::jsonb) AS id',
        ['order', agg, 'OrderPlaced', JSON.stringify({ writer, i })]);
      // The test's record of commit order (the counter's row lock orders the commits).
      if (i % 3 === 0) await client.query('SELECT pg_sleep(0.001)');
      await client.query(`WITH c AS (UPDATE counters SET n = n + 1 WHERE aggregate_id = $1 RETURNING n)
        INSERT INTO commit_seq SELECT $2, $1, n FROM c`, [agg, rows[0].id]);
      await client.query('COMMIT');
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => { console.error(err); process.exit(1); });

# The SQL append from Python (psycopg 3): run by test/writers (writers_test.go), which checks
# with an independent consumer that the events reach Kafka in commit order per aggregate.
#
#   python3 append.py WRITER AGGREGATES TRANSACTIONS   (database URL in OUTBOX_DATABASE_URL)
import json
import os
import sys

import psycopg

writer, aggregates, transactions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with psycopg.connect(os.environ["OUTBOX_DATABASE_URL"]) as conn:
    for i in range(transactions):
        agg = f"agg-{i % aggregates}"
        with conn.transaction():
            # The append: one statement, the aggregate's lock taken before the id is drawn.
            (event_id,) = conn.execute(
                "SELECT outbox_append(%s, %s, %s, %s::jsonb)",
                ("order", agg, "OrderPlaced", json.dumps({"writer": writer, "i": i})),
            ).fetchone()
            # The test's record of commit order (the counter's row lock orders the commits).
            if i % 3 == 0:
                conn.execute("SELECT pg_sleep(0.001)")
            conn.execute(
                "WITH c AS (UPDATE counters SET n = n + 1 WHERE aggregate_id = %s RETURNING n) "
                "INSERT INTO commit_seq SELECT %s, %s, n FROM c",
                (agg, event_id, agg),
            )

-- Partition upkeep, one implementation for the operator and `relay partitions`.

-- Creates the daily partitions for [from_day, to_day] (UTC) that do not exist yet and returns
-- their names. Rows of a new day that already sit in the default partition move into it.
CREATE FUNCTION {{.Func "create_partitions"}}(from_day date, to_day date) RETURNS SETOF text
LANGUAGE plpgsql AS $fn$
DECLARE
    d    date;
    part text;
    lo   timestamptz;
    hi   timestamptz;
BEGIN
    PERFORM pg_advisory_xact_lock({{.LockKey}}, -1);
    FOR d IN SELECT generate_series(from_day, to_day, interval '1 day')::date LOOP
        part := {{.NameLit}} || '_p' || to_char(d, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(format('%I.%I', {{.SchemaLit}}, part)) IS NOT NULL;
        lo := d::timestamp AT TIME ZONE 'UTC';
        hi := (d + 1)::timestamp AT TIME ZONE 'UTC';
        IF EXISTS (SELECT 1 FROM {{.Default}} WHERE created_at >= lo AND created_at < hi) THEN
            -- The relay fetches with FOR UPDATE SKIP LOCKED: rows this transaction moves must make
            -- it wait, not skip them (skipping could publish a later event of the same aggregate
            -- first). EXCLUSIVE conflicts with the ROW SHARE lock its fetch takes.
            EXECUTE format('LOCK TABLE %s IN EXCLUSIVE MODE', {{.DefaultLit}});
            EXECUTE format('CREATE TABLE %I.%I (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED)',
                {{.SchemaLit}}, part, {{.TableLit}});
            EXECUTE format('WITH moved AS (DELETE FROM %s WHERE created_at >= $1 AND created_at < $2 RETURNING *) '
                'INSERT INTO %I.%I (id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, sent_at, attempts, error) '
                'SELECT id, event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, sent_at, attempts, error FROM moved',
                {{.DefaultLit}}, {{.SchemaLit}}, part) USING lo, hi;
            EXECUTE format('ALTER TABLE %s ATTACH PARTITION %I.%I FOR VALUES FROM (%L) TO (%L)',
                {{.TableLit}}, {{.SchemaLit}}, part, lo, hi);
        ELSE
            EXECUTE format('CREATE TABLE %I.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                {{.SchemaLit}}, part, {{.TableLit}}, lo, hi);
        END IF;
        RETURN NEXT part;
    END LOOP;
END
$fn$;

-- Daily partitions of the outbox, oldest first: name, day, and whether a row in it is unsent.
CREATE FUNCTION {{.Func "partitions"}}() RETURNS TABLE (name text, day date, has_pending boolean)
LANGUAGE plpgsql STABLE AS $fn$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT c.relname::text AS relname
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = {{.TableLit}}::regclass
          AND c.relname ~ ('^' || {{.NameLit}} || '_p[0-9]{8}$')
        ORDER BY c.relname
    LOOP
        name := r.relname;
        day := to_date(right(r.relname, 8), 'YYYYMMDD');
        EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE sent_at IS NULL)', {{.SchemaLit}}, r.relname)
            INTO has_pending;
        RETURN NEXT;
    END LOOP;
END
$fn$;

-- Partitions whose whole day is older than the retention and whose rows are all sent.
CREATE FUNCTION {{.Func "droppable_partitions"}}(retention interval) RETURNS SETOF text
LANGUAGE sql STABLE AS $fn$
    SELECT name FROM {{.Func "partitions"}}()
    WHERE NOT has_pending
      AND (day + 1)::timestamp AT TIME ZONE 'UTC' <= now() - retention
    ORDER BY name
$fn$;

-- Drops one daily partition, under an exclusive lock, and only when every row in it is sent.
CREATE FUNCTION {{.Func "drop_partition"}}(part text) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    pending boolean;
BEGIN
    IF part !~ ('^' || {{.NameLit}} || '_p[0-9]{8}$') OR NOT EXISTS (
        SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = {{.TableLit}}::regclass AND c.relname = part) THEN
        RAISE EXCEPTION 'outbox: % is not a daily partition of %', part, {{.TableLit}}
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    EXECUTE format('LOCK TABLE %I.%I IN ACCESS EXCLUSIVE MODE', {{.SchemaLit}}, part);
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE sent_at IS NULL)', {{.SchemaLit}}, part) INTO STRICT pending;
    IF pending THEN
        RAISE EXCEPTION 'outbox: partition % still holds unsent events; it is kept', part
            USING ERRCODE = 'object_in_use';
    END IF;
    EXECUTE format('DROP TABLE %I.%I', {{.SchemaLit}}, part);
END
$fn$;

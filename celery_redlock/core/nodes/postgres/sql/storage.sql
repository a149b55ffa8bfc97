-- The keys of a PostgreSQL lock node, with the Redis semantics the operations
-- are written against: a key is a string, a hash or a sorted set, with an
-- optional expiry on the server's clock; an expired key is a missing key.
-- Every operation first takes a transaction-scoped advisory lock on each hash
-- tag of its keys (hashed, in hash order: no deadlock), so the calls on one key
-- run one after another, as a Redis script runs alone.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.meta (version integer NOT NULL);
-- The functions' revision within a version (schema.py): a release before the
-- column read the version alone, and its DDL leaves the revision at 0.
ALTER TABLE {schema}.meta ADD COLUMN IF NOT EXISTS revision integer NOT NULL DEFAULT 0;

CREATE TABLE IF NOT EXISTS {schema}.kv (
    key text PRIMARY KEY,
    kind "char" NOT NULL,          -- 's' string, 'h' hash, 'z' sorted set
    val text,                      -- a string's value
    map jsonb,                     -- a hash: field -> value; a sorted set: member -> score
    expires_at timestamptz         -- NULL: no expiry
);

-- What the sweep reads: the rows whose expiry has passed.
CREATE INDEX IF NOT EXISTS kv_expires_at ON {schema}.kv (expires_at)
    WHERE expires_at IS NOT NULL;

-- A key's hash tag, as Redis Cluster reads it: the text between its first "{"
-- and the first "}" after it when that is not empty, else the whole key. The
-- keys of one name share it. Positions, not a regular expression: every call
-- on a name reads its keys' tags, and a match cost more than the rest of them.
CREATE OR REPLACE FUNCTION {schema}.tag(k text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN strpos(k, '{') > 0 AND strpos(substr(k, strpos(k, '{') + 1), '}') > 1
                THEN substr(k, strpos(k, '{') + 1, strpos(substr(k, strpos(k, '{') + 1), '}') - 1)
                ELSE k END;
$$;

-- Serialize the calls on ``keys`` (see above): a call on one name's keys, the
-- common one, takes one lock and runs no query for it.
CREATE OR REPLACE FUNCTION {schema}.lock_keys(keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    first text := {schema}.tag(keys[1]);
BEGIN
    FOR i IN 2 .. coalesce(array_length(keys, 1), 0) LOOP
        IF {schema}.tag(keys[i]) <> first THEN
            PERFORM pg_advisory_xact_lock(h)
               FROM (SELECT DISTINCT hashtextextended({schema}.tag(k), 0) AS h
                       FROM unnest(keys) k ORDER BY 1) x;
            RETURN;
        END IF;
    END LOOP;
    PERFORM pg_advisory_xact_lock(hashtextextended(first, 0));
END $$;

-- The live row of ``k`` (none when missing or expired).
CREATE OR REPLACE FUNCTION {schema}.live(k text) RETURNS SETOF {schema}.kv
LANGUAGE sql STABLE AS $$
    SELECT * FROM {schema}.kv
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp());
$$;

-- One call in eight that may write (``random() < 0.125`` where it is called) clears
-- up to 32 expired rows: keys used once do not pile up. The pace is 4 a call, at an
-- eighth of the scans (the scan, not the rows, is what a call pays for).
CREATE OR REPLACE FUNCTION {schema}.sweep() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    -- A value, not clock_timestamp() in the condition: a volatile call is no index
    -- bound, and the scan would read every live row that has an expiry.
    now_ts timestamptz := clock_timestamp();
BEGIN
    DELETE FROM {schema}.kv WHERE key IN (
        SELECT key FROM {schema}.kv WHERE expires_at < now_ts
         ORDER BY expires_at LIMIT 32 FOR UPDATE SKIP LOCKED);
END $$;

-- The same for a lock's own acquire (``random() < 0.03125``): up to 128 rows in one
-- call in 32, the same pace of 4 a call in a quarter of the scans (its release adds
-- no row, and sweeps none). A constant limit: a generic plan keeps to the index.
CREATE OR REPLACE FUNCTION {schema}.sweep_wide() RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    now_ts timestamptz := clock_timestamp();
BEGIN
    DELETE FROM {schema}.kv WHERE key IN (
        SELECT key FROM {schema}.kv WHERE expires_at < now_ts
         ORDER BY expires_at LIMIT 128 FOR UPDATE SKIP LOCKED);
END $$;

CREATE OR REPLACE FUNCTION {schema}.typed(k text, want "char") RETURNS {schema}.kv
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.kv;
BEGIN
    SELECT * INTO r FROM {schema}.kv
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp());
    IF FOUND AND r.kind <> want THEN
        RAISE EXCEPTION 'WRONGTYPE Operation against a key holding the wrong kind of value';
    END IF;
    RETURN r;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_get(k text) RETURNS text
LANGUAGE plpgsql AS $$ BEGIN RETURN ({schema}.typed(k, 's')).val; END $$;

-- SET k v [PX px] [NX]: true when set. Without px the key keeps no expiry.
CREATE OR REPLACE FUNCTION {schema}.r_set(k text, v text, px bigint DEFAULT NULL,
                                          nx boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF nx AND {schema}.r_exists(k) = 1 THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
    VALUES (k, 's', v, NULL, clock_timestamp() + px * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE
       SET kind = 's', val = EXCLUDED.val, map = NULL, expires_at = EXCLUDED.expires_at;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_pttl(k text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t timestamptz;
BEGIN
    SELECT expires_at INTO t FROM {schema}.kv
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp());
    IF NOT FOUND THEN RETURN -2; END IF;
    IF t IS NULL THEN RETURN -1; END IF;
    RETURN greatest(0, floor(extract(epoch FROM t - clock_timestamp()) * 1000))::bigint;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_pexpire(k text, ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {schema}.kv SET expires_at = clock_timestamp() + ms * interval '1 millisecond'
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp());
    RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_del(VARIADIC ks text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
BEGIN
    WITH d AS (DELETE FROM {schema}.kv WHERE key = ANY(ks) RETURNING expires_at)
    SELECT count(*)::int INTO n FROM d
     WHERE expires_at IS NULL OR expires_at > clock_timestamp();
    RETURN n;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_exists(k text) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {schema}.kv
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp());
    RETURN CASE WHEN FOUND THEN 1 ELSE 0 END;
END $$;

-- SET k v NX PX px as a plain command: 'OK' or null.
CREATE OR REPLACE FUNCTION {schema}.set_nx(k text, v text, px bigint) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {schema}.lock_keys(ARRAY[k]);
    RETURN CASE WHEN {schema}.r_set(k, v, px, true) THEN '"OK"'::jsonb ELSE 'null'::jsonb END;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_hget(k text, f text) RETURNS text
LANGUAGE plpgsql AS $$ BEGIN RETURN ({schema}.typed(k, 'h')).map ->> f; END $$;

CREATE OR REPLACE FUNCTION {schema}.r_hmget(k text, fs text[]) RETURNS text[]
LANGUAGE sql AS $$
    SELECT ARRAY(SELECT m ->> f FROM unnest(fs) WITH ORDINALITY AS x(f, i),
                                     (SELECT ({schema}.typed(k, 'h')).map AS m) y ORDER BY i);
$$;

-- HSET k f1 v1 f2 v2 ...: the number of fields added.
CREATE OR REPLACE FUNCTION {schema}.r_hset(k text, VARIADIC fv text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.kv := {schema}.typed(k, 'h');
    cur jsonb := r.map;
    added integer := 0;
    i integer := 1;
    ttl timestamptz := r.expires_at;
BEGIN
    cur := coalesce(cur, '{}'::jsonb);
    WHILE i < array_length(fv, 1) LOOP
        IF NOT cur ? fv[i] THEN added := added + 1; END IF;
        cur := cur || jsonb_build_object(fv[i], fv[i + 1]);
        i := i + 2;
    END LOOP;
    INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
    VALUES (k, 'h', NULL, cur, ttl)
    ON CONFLICT (key) DO UPDATE
       SET kind = 'h', val = NULL, map = EXCLUDED.map, expires_at = EXCLUDED.expires_at;
    RETURN added;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_hincrby(k text, f text, n bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v bigint := coalesce({schema}.r_hget(k, f), '0')::bigint + n;
BEGIN
    PERFORM {schema}.r_hset(k, f, v::text);
    RETURN v;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_hdel(k text, VARIADIC fs text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cur jsonb := ({schema}.typed(k, 'h')).map;
    gone integer;
BEGIN
    IF cur IS NULL THEN RETURN 0; END IF;
    gone := (SELECT count(*) FROM unnest(fs) f WHERE cur ? f);
    cur := cur - fs;
    IF cur = '{}'::jsonb THEN
        DELETE FROM {schema}.kv WHERE key = k;
    ELSE
        UPDATE {schema}.kv SET map = cur WHERE key = k;
    END IF;
    RETURN gone;
END $$;

-- ZADD k score member (scores kept as numbers).
CREATE OR REPLACE FUNCTION {schema}.r_zadd(k text, score double precision, m text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    r {schema}.kv := {schema}.typed(k, 'z');
    cur jsonb := coalesce(r.map, '{}'::jsonb);
    ttl timestamptz := r.expires_at;
    added integer := CASE WHEN cur ? m THEN 0 ELSE 1 END;
BEGIN
    INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
    VALUES (k, 'z', NULL, cur || jsonb_build_object(m, score), ttl)
    ON CONFLICT (key) DO UPDATE
       SET kind = 'z', val = NULL, map = EXCLUDED.map, expires_at = EXCLUDED.expires_at;
    RETURN added;
END $$;

-- A sorted set's members with their scores, in Redis's order (score, then member).
CREATE OR REPLACE FUNCTION {schema}.zmembers(k text)
RETURNS TABLE (member text, score double precision)
LANGUAGE sql AS $$
    SELECT e.key, e.value::text::double precision
      FROM jsonb_each(({schema}.typed(k, 'z')).map) e ORDER BY 2, e.key COLLATE "C";
$$;

-- Keep ``keep`` (member -> score) as the set, or drop the key when empty.
CREATE OR REPLACE FUNCTION {schema}.zkeep(k text, keep jsonb) RETURNS void
LANGUAGE sql AS $$
    DELETE FROM {schema}.kv WHERE key = k AND keep = '{}'::jsonb;
    UPDATE {schema}.kv SET map = keep WHERE key = k AND keep <> '{}'::jsonb;
$$;

CREATE OR REPLACE FUNCTION {schema}.r_zrem(k text, VARIADIC ms text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cur jsonb := ({schema}.typed(k, 'z')).map;
    gone integer;
BEGIN
    IF cur IS NULL THEN RETURN 0; END IF;
    gone := (SELECT count(*) FROM unnest(ms) m WHERE cur ? m);
    PERFORM {schema}.zkeep(k, cur - ms);
    RETURN gone;
END $$;

-- ZREMRANGEBYSCORE k lo hi, with Redis's '-inf', '+inf' and '(x' (exclusive).
CREATE OR REPLACE FUNCTION {schema}.r_zremrangebyscore(k text, lo text, hi text)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    lo_x boolean := left(lo, 1) = '(';
    hi_x boolean := left(hi, 1) = '(';
    lo_v double precision := CASE WHEN lo_x THEN substr(lo, 2) ELSE lo END::double precision;
    hi_v double precision := CASE WHEN hi_x THEN substr(hi, 2) ELSE hi END::double precision;
    keep jsonb;
    gone integer;
BEGIN
    IF ({schema}.typed(k, 'z')).key IS NULL THEN RETURN 0; END IF;
    SELECT coalesce(jsonb_object_agg(member, score) FILTER (WHERE NOT hit), '{}'::jsonb),
           count(*) FILTER (WHERE hit)
      INTO keep, gone
      FROM (SELECT member, score,
                   (score > lo_v OR (NOT lo_x AND score = lo_v))
                   AND (score < hi_v OR (NOT hi_x AND score = hi_v)) AS hit
              FROM {schema}.zmembers(k)) z;
    PERFORM {schema}.zkeep(k, keep);
    RETURN gone;
END $$;

-- ZREMRANGEBYRANK k start stop (0-based, negative from the end, as Redis).
CREATE OR REPLACE FUNCTION {schema}.r_zremrangebyrank(k text, first bigint, last bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    n bigint := (SELECT count(*) FROM {schema}.zmembers(k));
    keep jsonb;
BEGIN
    IF first < 0 THEN first := greatest(n + first, 0); END IF;
    IF last < 0 THEN last := n + last; END IF;
    IF last >= n THEN last := n - 1; END IF;
    IF n = 0 OR first > last THEN RETURN 0; END IF;
    SELECT coalesce(jsonb_object_agg(member, score), '{}'::jsonb) INTO keep
      FROM (SELECT member, score, row_number() OVER () - 1 AS r
              FROM {schema}.zmembers(k)) z
     WHERE r < first OR r > last;
    PERFORM {schema}.zkeep(k, keep);
    RETURN last - first + 1;
END $$;

-- TIME: {seconds, microseconds} of the server's clock.
CREATE OR REPLACE FUNCTION {schema}.r_time() RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    e numeric := extract(epoch FROM clock_timestamp());
BEGIN
    RETURN ARRAY[floor(e)::bigint, ((e - floor(e)) * 1000000)::bigint];
END $$;

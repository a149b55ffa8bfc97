-- The keys of a PostgreSQL lock node, with the Redis semantics the operations
-- are written against: a key is a string, a hash or a sorted set, with an
-- optional expiry on the server's clock; an expired key is a missing key.
-- Every operation first takes a transaction-scoped advisory lock on each of
-- its keys (hashed, in hash order: no deadlock), so the calls on one key run
-- one after another, as a Redis script runs alone.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.meta (version integer NOT NULL);

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

-- Serialize the calls on ``keys`` (see above).
CREATE OR REPLACE FUNCTION {schema}.lock_keys(keys text[]) RETURNS void
LANGUAGE sql AS $$
    SELECT count(pg_advisory_xact_lock(h))::int * 0
      FROM (SELECT DISTINCT hashtextextended(k, 0) AS h FROM unnest(keys) k ORDER BY 1) x;
$$;

-- The live row of ``k`` (none when missing or expired).
CREATE OR REPLACE FUNCTION {schema}.live(k text) RETURNS SETOF {schema}.kv
LANGUAGE sql STABLE AS $$
    SELECT * FROM {schema}.kv
     WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp());
$$;

-- Writes clear a few expired rows as they go: keys used once do not pile up.
CREATE OR REPLACE FUNCTION {schema}.sweep() RETURNS void
LANGUAGE sql AS $$
    DELETE FROM {schema}.kv WHERE key IN (
        SELECT key FROM {schema}.kv WHERE expires_at < clock_timestamp()
         ORDER BY expires_at LIMIT 4 FOR UPDATE SKIP LOCKED);
$$;

CREATE OR REPLACE FUNCTION {schema}.expiry(px bigint) RETURNS timestamptz
LANGUAGE sql AS $$
    SELECT CASE WHEN px IS NULL THEN NULL
                ELSE clock_timestamp() + px * interval '1 millisecond' END;
$$;

CREATE OR REPLACE FUNCTION {schema}.r_get(k text) RETURNS text
LANGUAGE sql AS $$ SELECT val FROM {schema}.live(k) WHERE kind = 's'; $$;

-- SET k v [PX px] [NX]: true when set. Without px the key keeps no expiry.
CREATE OR REPLACE FUNCTION {schema}.r_set(k text, v text, px bigint DEFAULT NULL,
                                          nx boolean DEFAULT false) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF nx AND EXISTS (SELECT 1 FROM {schema}.live(k)) THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
    VALUES (k, 's', v, NULL, {schema}.expiry(px))
    ON CONFLICT (key) DO UPDATE
       SET kind = 's', val = EXCLUDED.val, map = NULL, expires_at = EXCLUDED.expires_at;
    PERFORM {schema}.sweep();
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION {schema}.r_pttl(k text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT coalesce((SELECT CASE WHEN expires_at IS NULL THEN -1
                                 ELSE greatest(0, floor(extract(epoch FROM
                                      expires_at - clock_timestamp()) * 1000))::bigint
                            END FROM {schema}.live(k)), -2);
$$;

CREATE OR REPLACE FUNCTION {schema}.r_pexpire(k text, ms bigint) RETURNS integer
LANGUAGE sql AS $$
    WITH u AS (UPDATE {schema}.kv SET expires_at = {schema}.expiry(ms)
                WHERE key = k AND (expires_at IS NULL OR expires_at > clock_timestamp())
               RETURNING 1)
    SELECT count(*)::int FROM u;
$$;

CREATE OR REPLACE FUNCTION {schema}.r_del(VARIADIC ks text[]) RETURNS integer
LANGUAGE sql AS $$
    WITH d AS (DELETE FROM {schema}.kv WHERE key = ANY(ks) RETURNING expires_at)
    SELECT count(*)::int FROM d WHERE expires_at IS NULL OR expires_at > clock_timestamp();
$$;

CREATE OR REPLACE FUNCTION {schema}.r_exists(k text) RETURNS integer
LANGUAGE sql AS $$ SELECT count(*)::int FROM {schema}.live(k); $$;

CREATE OR REPLACE FUNCTION {schema}.r_hget(k text, f text) RETURNS text
LANGUAGE sql AS $$ SELECT map ->> f FROM {schema}.live(k) WHERE kind = 'h'; $$;

CREATE OR REPLACE FUNCTION {schema}.r_hmget(k text, fs text[]) RETURNS text[]
LANGUAGE sql AS $$
    SELECT ARRAY(SELECT (SELECT map ->> f FROM {schema}.live(k) WHERE kind = 'h')
                   FROM unnest(fs) WITH ORDINALITY AS x(f, i) ORDER BY i);
$$;

-- HSET k f1 v1 f2 v2 ...: the number of fields added.
CREATE OR REPLACE FUNCTION {schema}.r_hset(k text, VARIADIC fv text[]) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    cur jsonb := (SELECT map FROM {schema}.live(k) WHERE kind = 'h');
    added integer := 0;
    i integer := 1;
    ttl timestamptz := (SELECT expires_at FROM {schema}.live(k) WHERE kind = 'h');
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
    cur jsonb := (SELECT map FROM {schema}.live(k) WHERE kind = 'h');
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
    cur jsonb := coalesce((SELECT map FROM {schema}.live(k) WHERE kind = 'z'), '{}'::jsonb);
    ttl timestamptz := (SELECT expires_at FROM {schema}.live(k) WHERE kind = 'z');
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
      FROM {schema}.live(k) l, jsonb_each(l.map) e
     WHERE l.kind = 'z' ORDER BY 2, e.key COLLATE "C";
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
    cur jsonb := (SELECT map FROM {schema}.live(k) WHERE kind = 'z');
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
    IF NOT EXISTS (SELECT 1 FROM {schema}.live(k) WHERE kind = 'z') THEN RETURN 0; END IF;
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
LANGUAGE sql AS $$
    SELECT ARRAY[floor(e)::bigint, ((e - floor(e)) * 1000000)::bigint]
      FROM (SELECT extract(epoch FROM clock_timestamp()) AS e) x;
$$;

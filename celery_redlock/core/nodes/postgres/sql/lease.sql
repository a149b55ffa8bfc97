-- The lease's operations and the helpers composed into them: each mirrors the
-- Lua script of the same name (celery_redlock/core/nodes/scripts/), keys k and
-- arguments a as KEYS and ARGV, the reply as JSON (strings, integers, null).

-- Digits-only comparison: true when token a > token b.
CREATE OR REPLACE FUNCTION {schema}.greater(x text, y text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN length(x) <> length(y) THEN length(x) > length(y)
                ELSE x COLLATE "C" > y COLLATE "C" END;
$$;

CREATE OR REPLACE FUNCTION {schema}.owns(k text, owner text) RETURNS boolean
LANGUAGE plpgsql AS $$ BEGIN RETURN {schema}.r_get(k) IS NOT DISTINCT FROM owner; END $$;

-- The floor of a grant's fence value (ADVANCE's fence_floor): max(the server's
-- clock, the client's clock a[4] a second on), in microseconds.
CREATE OR REPLACE FUNCTION {schema}.fence_floor(now_us text) RETURNS numeric
LANGUAGE sql AS $$
    SELECT greatest(coalesce(nullif(now_us, ''), '0')::numeric + 1000000,
                    floor(extract(epoch FROM clock_timestamp()) * 1000000));
$$;

-- The fence value of a grant: max(the node's value moved on, the floor), kept
-- when ``again``; numeric arithmetic on the decimal text, exact at any length.
CREATE OR REPLACE FUNCTION {schema}.advance(fkey text, again boolean, a text[]) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    fence text;
    low numeric;
BEGIN
    IF NOT again THEN  -- one upsert: moved on where it lives, else the floor
        low := {schema}.fence_floor(a[4]);
        INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
        VALUES (fkey, 's', low::text, NULL,
                clock_timestamp() + a[3]::bigint * interval '1 millisecond')
        ON CONFLICT (key) DO UPDATE
           SET val = CASE WHEN t.expires_at IS NULL OR t.expires_at > clock_timestamp()
                          THEN greatest(t.val::numeric + 1, low)::text ELSE EXCLUDED.val END,
               kind = 's', map = NULL, expires_at = EXCLUDED.expires_at
         WHERE t.kind = 's' OR t.expires_at <= clock_timestamp()
        RETURNING val INTO fence;
        IF FOUND THEN RETURN fence; END IF;
    END IF;
    -- kept (``again``), or a live key of another type: read it as GET does
    fence := {schema}.r_get(fkey);
    IF fence IS NOT NULL AND again THEN RETURN fence; END IF;
    fence := greatest(fence::numeric + 1, {schema}.fence_floor(a[4]))::text;  -- NULL: the floor
    PERFORM {schema}.r_set(fkey, fence, a[3]::bigint);
    RETURN fence;
END $$;

-- The gates of an acquire (GATES): the claim the caller meets, and the reply
-- that stops the grant, if any.
CREATE OR REPLACE FUNCTION {schema}.flag(a text[], f text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$ SELECT strpos(coalesce(a[6], ''), f) > 0; $$;

CREATE OR REPLACE FUNCTION {schema}.gate_enter(k text[], a text[], OUT stop jsonb,
                                               OUT claim text)
LANGUAGE plpgsql AS $$
DECLARE
    h text[];
    winner text;
BEGIN
    IF {schema}.flag(a, 'r') AND {schema}.r_exists(k[3]) = 1 THEN
        stop := '[2]';
        RETURN;
    END IF;
    IF {schema}.flag(a, 'c') THEN
        claim := {schema}.r_get(k[4]);
        IF claim = '~' || a[5] THEN
            claim := a[5];
        ELSIF claim IS NOT NULL AND NOT {schema}.flag(a, 's') AND left(claim, 1) = '~' THEN
            claim := NULL;
        END IF;
    END IF;
    IF {schema}.flag(a, 't') AND coalesce(a[9], '') <> '' THEN
        h := {schema}.r_hmget(k[5], ARRAY['due', 'id', 'pdue', 'pid']);
        winner := CASE WHEN h[1] = a[9] AND h[2] IS NOT NULL THEN h[2]
                       WHEN h[3] = a[9] AND h[4] IS NOT NULL THEN h[4] END;
        IF winner IS NOT NULL AND winner <> a[5] THEN
            stop := jsonb_build_array(3, winner, -1);
            RETURN;
        END IF;
        claim := a[5];
    END IF;
END $$;

CREATE OR REPLACE FUNCTION {schema}.gate_free(k text[], a text[], claim text) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    wait numeric;
BEGIN
    IF claim IS NOT NULL AND claim <> a[5] THEN
        RETURN jsonb_build_array(3, claim, {schema}.r_pttl(k[4]));
    END IF;
    IF {schema}.flag(a, 't') THEN
        wait := {schema}.r_hget(k[5], 'start')::numeric + a[7]::numeric - a[8]::numeric;
        IF wait > 0 THEN RETURN jsonb_build_array(4, trunc(wait)); END IF;
    END IF;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION {schema}.gate_granted(k text[], a text[], claim text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    remaining bigint;
BEGIN
    IF claim IS NOT NULL AND {schema}.flag(a, 'w') THEN
        remaining := {schema}.r_pttl(k[4]);
        IF remaining > 0 THEN PERFORM {schema}.r_set(k[4], '~' || a[5], remaining); END IF;
    END IF;
    IF {schema}.flag(a, 't') THEN
        PERFORM {schema}.r_hset(k[5], 'start', a[8]);
        IF {schema}.r_pttl(k[5]) < a[7]::numeric THEN
            PERFORM {schema}.r_pexpire(k[5], a[7]::bigint);
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION {schema}.acquire(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    holder text;
    g record;
    stop jsonb;
BEGIN
    IF a[5] IS NULL THEN  -- no gate: the lock's own function (below)
        RETURN {schema}.acquire_plain(k[1], k[2], a[1], a[2]::bigint, a[3], a[4])::jsonb;
    END IF;
    g := {schema}.gate_enter(k, a);
    IF g.stop IS NOT NULL THEN RETURN g.stop; END IF;
    holder := {schema}.r_get(k[1]);
    IF holder IS NOT NULL AND holder <> a[1] THEN
        RETURN jsonb_build_array(0, holder, {schema}.r_pttl(k[1]), g.claim);
    END IF;
    stop := {schema}.gate_free(k, a, g.claim);
    IF stop IS NOT NULL THEN RETURN stop; END IF;
    PERFORM {schema}.r_set(k[1], a[1], a[2]::bigint);
    PERFORM {schema}.gate_granted(k, a, g.claim);
    IF a[3] = '' THEN RETURN '[1]'; END IF;
    RETURN jsonb_build_array(1, {schema}.advance(k[2], holder IS NOT NULL, a));
END $$;

CREATE OR REPLACE FUNCTION {schema}.issue(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT {schema}.owns(k[1], a[1]) THEN RETURN 'null'; END IF;
    RETURN to_jsonb({schema}.advance(k[2], false, a));
END $$;

CREATE OR REPLACE FUNCTION {schema}.fence(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    cur text;
BEGIN
    IF NOT {schema}.owns(k[1], a[1]) THEN RETURN '0'; END IF;
    cur := {schema}.r_get(k[2]);
    IF cur IS NOT NULL AND NOT {schema}.greater(a[2], cur)
       AND (cur <> a[2] OR a[4] IS NOT DISTINCT FROM 's') THEN
        RETURN '0';
    END IF;
    PERFORM {schema}.r_set(k[2], a[2], a[3]::bigint);
    RETURN '1';
END $$;

-- One call renews every lease a process holds on this node.
CREATE OR REPLACE FUNCTION {schema}.extend(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    out jsonb := '[]';
BEGIN
    FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
        IF {schema}.owns(k[i], a[2 * i - 1]) THEN
            PERFORM {schema}.r_pexpire(k[i], a[2 * i]::bigint);
            out := out || '1'::jsonb;
        ELSE
            out := out || '0'::jsonb;
        END IF;
    END LOOP;
    RETURN out;
END $$;

CREATE OR REPLACE FUNCTION {schema}.release(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    out integer := 0;
    remaining bigint;
BEGIN
    DELETE FROM {schema}.kv
     WHERE key = k[1] AND kind = 's' AND val = a[1]
       AND (expires_at IS NULL OR expires_at > clock_timestamp());
    GET DIAGNOSTICS out = ROW_COUNT;
    IF out = 0 THEN PERFORM {schema}.owns(k[1], a[1]); END IF;  -- GET's WRONGTYPE, if any
    IF coalesce(a[2], '') <> '' THEN PERFORM {schema}.r_set(k[2], '1', a[2]::bigint); END IF;
    IF coalesce(a[3], '') <> '' AND {schema}.owns(k[3], a[3]) THEN
        remaining := {schema}.r_pttl(k[3]);
        IF remaining > 0 THEN
            PERFORM {schema}.r_set(k[3], '~' || a[3], remaining);
        ELSE
            PERFORM {schema}.r_del(k[3]);
        END IF;
    END IF;
    RETURN to_jsonb(out);
END $$;

CREATE OR REPLACE FUNCTION {schema}.release_prefix(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    out integer := 0;
    holder text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
        holder := {schema}.r_get(k[i]);
        IF holder IS NOT NULL AND starts_with(holder, a[1]) THEN
            out := out + {schema}.r_del(k[i]);
        END IF;
    END LOOP;
    RETURN to_jsonb(out);
END $$;

CREATE OR REPLACE FUNCTION {schema}.inspect(k text[], a text[]) RETURNS jsonb
LANGUAGE sql AS $$
    SELECT jsonb_build_array({schema}.r_get(k[1]), {schema}.r_pttl(k[1]), {schema}.r_get(k[2]));
$$;

CREATE OR REPLACE FUNCTION {schema}.peek(k text[], a text[]) RETURNS jsonb
LANGUAGE sql AS $$ SELECT jsonb_build_array({schema}.r_get(k[1]), {schema}.r_pttl(k[1])); $$;

-- The two calls of every lock, an acquire no gate applies to and a plain release,
-- as one function each with scalar arguments and, in the common case, nothing
-- nested: a call's cost on the server is mostly the PL/pgSQL functions it passes
-- through. Each does what run('acquire' | 'release', ...) does: the same advisory
-- lock, the same rows, and the sweep at run's pace in fewer scans (storage.sql).
CREATE OR REPLACE FUNCTION {schema}.acquire_plain(k1 text, k2 text, owner text, px bigint,
                                                  retention text, now_us text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    tag text := {schema}.tag(k1);
    holder text;
    fence text;
    low numeric;
BEGIN
    -- the lock as an expression, not a query (PERFORM): it costs a call, not a plan
    IF {schema}.tag(k2) <> tag THEN  -- a key space whose two keys differ in tag
        PERFORM {schema}.lock_keys(ARRAY[k1, k2]);
    ELSIF pg_advisory_xact_lock(hashtextextended(tag, 0)) IS NULL THEN
        NULL;
    END IF;
    IF random() < 0.03125 THEN PERFORM {schema}.sweep_wide(); END IF;  -- its pace
    INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
    VALUES (k1, 's', owner, NULL, clock_timestamp() + px * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE
       SET kind = 's', val = EXCLUDED.val, map = NULL, expires_at = EXCLUDED.expires_at
     WHERE t.expires_at <= clock_timestamp();
    IF NOT FOUND THEN  -- held, or this very call sent again (then it is ours: kept)
        holder := {schema}.r_get(k1);
        IF holder IS DISTINCT FROM owner THEN
            RETURN jsonb_build_array(0, holder, {schema}.r_pttl(k1), NULL)::text;
        END IF;
        PERFORM {schema}.r_set(k1, owner, px);
        IF retention = '' THEN RETURN '[1]'; END IF;
        fence := {schema}.advance(k2, true, ARRAY[owner, px::text, retention, now_us]);
        RETURN jsonb_build_array(1, fence)::text;
    END IF;
    IF retention = '' THEN RETURN '[1]'; END IF;
    -- advance(k2, false, ...) written out: moved on where it lives (an update, the
    -- common case, cheaper than the upsert's insertion attempt), else the floor
    low := {schema}.fence_floor(now_us);
    UPDATE {schema}.kv
       SET val = greatest(val::numeric + 1, low)::text, map = NULL,
           expires_at = clock_timestamp() + retention::bigint * interval '1 millisecond'
     WHERE key = k2 AND kind = 's' AND (expires_at IS NULL OR expires_at > clock_timestamp())
    RETURNING val INTO fence;
    IF FOUND THEN RETURN '[1,"' || fence || '"]'; END IF;  -- digits only: nothing to escape
    INSERT INTO {schema}.kv AS t (key, kind, val, map, expires_at)
    VALUES (k2, 's', low::text, NULL,
            clock_timestamp() + retention::bigint * interval '1 millisecond')
    ON CONFLICT (key) DO UPDATE
       SET val = CASE WHEN t.expires_at IS NULL OR t.expires_at > clock_timestamp()
                      THEN greatest(t.val::numeric + 1, low)::text ELSE EXCLUDED.val END,
           kind = 's', map = NULL, expires_at = EXCLUDED.expires_at
     WHERE t.kind = 's' OR t.expires_at <= clock_timestamp()
    RETURNING val INTO fence;
    IF NOT FOUND THEN  -- a live key of another type: advance raises as GET does
        fence := {schema}.advance(k2, false, ARRAY[owner, px::text, retention, now_us]);
    END IF;
    RETURN '[1,"' || fence || '"]';  -- digits only: nothing to escape
END $$;

-- A plain release commits without waiting for its WAL flush: lost in a crash,
-- it leaves the lease to run out, never a second holder (a grant after it waits
-- for its own flush, which writes the WAL up to it, release included).
CREATE OR REPLACE FUNCTION {schema}.release_plain(k1 text, owner text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    out integer;
BEGIN
    IF pg_advisory_xact_lock(hashtextextended({schema}.tag(k1), 0)) IS NULL THEN NULL; END IF;
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM {schema}.kv
     WHERE key = k1 AND kind = 's' AND val = owner
       AND (expires_at IS NULL OR expires_at > clock_timestamp());
    GET DIAGNOSTICS out = ROW_COUNT;
    IF out = 0 THEN PERFORM {schema}.owns(k1, owner); END IF;  -- GET's WRONGTYPE, if any
    RETURN out::text;
END $$;

-- The rate reservation (scripts/rates.py): GCRA on the paced window, a log of
-- the bookings for the counted ones, booked in two phases, and the acquires
-- that book a rated start in their own call.

CREATE OR REPLACE FUNCTION {schema}.tat(key text, field text) RETURNS numeric
LANGUAGE sql AS $$ SELECT coalesce({schema}.num({schema}.r_hget(key, field)), 0); $$;

-- The first instant a window admits: the paced one's TAT less its tau (n = 0),
-- a counted one's N-th latest booking in the log plus its period.
CREATE OR REPLACE FUNCTION {schema}.rate_admits(
    key text, log text, field text, tau numeric, period numeric, n numeric
) RETURNS numeric
LANGUAGE sql AS $$
    SELECT CASE WHEN n = 0 THEN {schema}.tat(key, field) - tau
        ELSE coalesce((SELECT score::numeric + period FROM {schema}.zmembers(log)
                        ORDER BY score DESC LIMIT 1 OFFSET n - 1), 0) END;
$$;

CREATE OR REPLACE FUNCTION {schema}.rate(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    phase text := a[1];
    now numeric := a[2]::numeric;
    nk integer := coalesce(array_length(k, 1), 0) / 2;
    versions text[] := '{}';
    counts numeric[] := '{}';
    -- the windows, in order: the index of their key, field, T, tau, period, and N
    -- for a counted window (0: the paced one)
    w_key integer[] := '{}';
    w_field text[] := '{}';
    w_t numeric[] := '{}';
    w_tau numeric[] := '{}';
    w_period numeric[] := '{}';
    w_n numeric[] := '{}';
    ai integer := 4;
    m integer;
    start numeric;
    t numeric;
    v bigint;
    ttl bigint;
    tokens text[];
    out jsonb;
    before jsonb := '[]';
    horizon numeric;
    longest numeric;
    at text := '-';
BEGIN
    IF phase = '0' THEN
        tokens := regexp_split_to_array(btrim(coalesce(a[3], '')), '\s+');
        at := coalesce(nullif(tokens[1], ''), '-');
    END IF;
    FOR i IN 1 .. nk LOOP
        versions := versions || a[ai];
        counts := counts || 0::numeric;
        m := a[ai + 1]::integer;
        ai := ai + 2;
        FOR j IN 1 .. m LOOP
            w_key := w_key || i;
            w_field := w_field || a[ai];
            w_t := w_t || a[ai + 1]::numeric;
            w_tau := w_tau || a[ai + 2]::numeric;
            w_period := w_period || a[ai + 3]::numeric;
            w_n := w_n || a[ai + 4]::numeric;
            IF a[ai + 4]::numeric > 0 THEN
                counts[i] := greatest(counts[i], a[ai + 3]::numeric);
            END IF;
            ai := ai + 5;
        END LOOP;
    END LOOP;
    IF phase <> '1' THEN
        FOR i IN 1 .. nk LOOP
            CONTINUE WHEN counts[i] = 0;
            IF at = '-' THEN
                PERFORM {schema}.r_zrem(k[nk + i], versions[i]);
            ELSE
                PERFORM {schema}.r_zadd(k[nk + i], at::double precision, versions[i]);
                ttl := trunc(at::numeric - now + counts[i])::bigint;
                IF {schema}.r_pttl(k[nk + i]) < ttl THEN
                    PERFORM {schema}.r_pexpire(k[nk + i], ttl);
                END IF;
            END IF;
        END LOOP;
    END IF;
    IF phase = '0' THEN
        FOR i IN 1 .. nk LOOP
            IF coalesce({schema}.r_hget(k[i], 'v'), '') <> versions[i] THEN RETURN '[0]'; END IF;
        END LOOP;
        FOR i IN 1 .. nk LOOP
            FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
                CONTINUE WHEN w_key[j] <> i OR w_n[j] > 0;
                IF tokens[j + 1] IS NULL OR tokens[j + 1] IN ('-', '') THEN
                    PERFORM {schema}.r_hdel(k[i], w_field[j]);
                ELSE
                    PERFORM {schema}.r_hset(k[i], w_field[j], tokens[j + 1]);
                END IF;
            END LOOP;
            PERFORM {schema}.r_hincrby(k[i], 'v', 1);
        END LOOP;
        RETURN '[1]';
    END IF;
    IF phase = '1' THEN
        start := now;
        FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
            start := greatest(start, {schema}.rate_admits(
                k[w_key[j]], k[nk + w_key[j]], w_field[j], w_tau[j], w_period[j], w_n[j]));
        END LOOP;
        IF a[3] <> '' AND start < a[3]::numeric THEN
            RETURN jsonb_build_array(2, trunc(start)::text);
        END IF;
    ELSE
        start := a[3]::numeric;
        FOR i IN 1 .. nk LOOP
            IF coalesce({schema}.r_hget(k[i], 'v'), '') <> versions[i] THEN phase := '3'; END IF;
        END LOOP;
        -- the counted windows must admit s* here; after another booking came in
        -- between, the paced ones too (mine stays where it is and s* is booked anew)
        FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
            IF (w_n[j] > 0 OR phase = '3') AND {schema}.rate_admits(
                k[w_key[j]], k[nk + w_key[j]], w_field[j], w_tau[j], w_period[j], w_n[j]
            ) > start THEN
                RETURN '[0]';
            END IF;
        END LOOP;
    END IF;
    out := jsonb_build_array(1, trunc(start)::text);
    FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
        before := before || to_jsonb(CASE WHEN w_n[j] > 0 THEN '-'
            ELSE coalesce({schema}.r_hget(k[w_key[j]], w_field[j]), '-') END);
    END LOOP;
    FOR i IN 1 .. nk LOOP
        horizon := start;
        longest := 0;
        FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
            CONTINUE WHEN w_key[j] <> i;
            IF w_n[j] = 0 THEN
                t := {schema}.tat(k[i], w_field[j]);
                IF phase = '2' THEN t := t - w_t[j]; END IF;
                t := greatest(t, start) + w_t[j];
                PERFORM {schema}.r_hset(k[i], w_field[j], trunc(t)::text);
                horizon := greatest(horizon, t);
            END IF;
            longest := greatest(longest, w_period[j]);
        END LOOP;
        v := {schema}.r_hincrby(k[i], 'v', 1);
        out := out || to_jsonb(v);
        ttl := trunc(greatest(1, horizon - now + longest))::bigint;
        PERFORM {schema}.r_pexpire(k[i], ttl);
        IF counts[i] > 0 THEN
            PERFORM {schema}.r_zadd(k[nk + i], start::double precision,
                CASE WHEN phase = '1' THEN v::text ELSE versions[i] END);
            PERFORM {schema}.r_zremrangebyscore(
                k[nk + i], '-inf', '(' || trunc(now - counts[i])::text);
            PERFORM {schema}.r_pexpire(k[nk + i], ttl);
        END IF;
    END LOOP;
    IF phase <> '1' THEN RETURN '[1]'; END IF;
    RETURN out || before;
END $$;

-- An acquire (``inner``: acquire or acquire_permit) and the rate in one call
-- (scripts/rates.py ``rated``): the same keys and arguments, the same replies.
CREATE OR REPLACE FUNCTION {schema}.rated(inner_op text, k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    na integer := a[1]::integer;
    nv integer := a[2]::integer;
    akeys text[] := k[1 : na];
    reply jsonb;
    o integer := 3 + nv;
    mode text;
    now numeric;
    due numeric;
    keep numeric;
    cap integer;
    member text;
    nr integer;
    booking jsonb := 'null';
    at numeric;
    starts text;
    pos text;
BEGIN
    IF inner_op = 'acquire' THEN
        reply := {schema}.acquire(akeys, a[3 : 2 + nv]);
    ELSE
        reply := {schema}.acquire_permit(akeys, a[3 : 2 + nv]);
    END IF;
    IF reply -> 0 <> '1'::jsonb THEN RETURN reply; END IF;
    mode := a[o];
    now := a[o + 1]::numeric;
    due := a[o + 2]::numeric;
    keep := a[o + 3]::numeric;
    cap := a[o + 4]::integer;
    member := a[o + 5];
    nr := a[o + 7]::integer;
    at := now;
    IF mode = 'b' THEN
        booking := {schema}.rate(k[na + 1 : na + 2 * nr], a[o + 8 :]);
        at := (booking ->> 1)::numeric;
    END IF;
    IF at > due THEN
        FOREACH pos IN ARRAY regexp_split_to_array(btrim(coalesce(a[o + 6], '')), '\s+') LOOP
            CONTINUE WHEN pos = '';
            IF {schema}.owns(akeys[pos::integer], member) THEN
                PERFORM {schema}.r_del(akeys[pos::integer]);
            END IF;
        END LOOP;
        reply := '[7]';
    ELSE
        FOR i IN 1 .. nr LOOP
            starts := k[na + 2 * nr + i];
            PERFORM {schema}.r_zadd(starts, now::double precision, member);
            PERFORM {schema}.r_zremrangebyscore(starts, '-inf', '(' || trunc(now - keep)::text);
            PERFORM {schema}.r_zremrangebyrank(starts, 0, -(cap + 1));
            PERFORM {schema}.r_pexpire(starts, keep::bigint);
        END LOOP;
    END IF;
    RETURN reply || jsonb_build_array(booking);
END $$;

CREATE OR REPLACE FUNCTION {schema}.unstart(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n integer := a[2]::integer;
    out integer := 0;
BEGIN
    FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
        IF i <= n THEN
            IF {schema}.owns(k[i], a[1]) THEN out := out + {schema}.r_del(k[i]); END IF;
        ELSE
            PERFORM {schema}.r_zrem(k[i], a[1]);
        END IF;
    END LOOP;
    RETURN to_jsonb(out);
END $$;

-- One operation by name: its keys serialized first, then the operation. With
-- ``replicated``, the call's commit waits for a synchronous standby to apply it.
CREATE OR REPLACE FUNCTION {schema}.run(op text, k text[], a text[], replicated boolean)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    reply jsonb;
BEGIN
    IF replicated THEN PERFORM set_config('synchronous_commit', 'remote_apply', true); END IF;
    PERFORM {schema}.lock_keys(k);
    reply := CASE op
        WHEN 'acquire' THEN {schema}.acquire(k, a)
        WHEN 'issue' THEN {schema}.issue(k, a)
        WHEN 'fence' THEN {schema}.fence(k, a)
        WHEN 'extend' THEN {schema}.extend(k, a)
        WHEN 'release' THEN {schema}.release(k, a)
        WHEN 'release_prefix' THEN {schema}.release_prefix(k, a)
        WHEN 'inspect' THEN {schema}.inspect(k, a)
        WHEN 'peek' THEN {schema}.peek(k, a)
        WHEN 'acquire_permit' THEN {schema}.acquire_permit(k, a)
        WHEN 'claim' THEN {schema}.claim(k, a)
        WHEN 'claim_next' THEN {schema}.claim_next(k, a)
        WHEN 'debounce' THEN {schema}.debounce(k, a)
        WHEN 'throttle' THEN {schema}.throttle(k, a)
        WHEN 'rate' THEN {schema}.rate(k, a)
        WHEN 'acquire_rated' THEN {schema}.rated('acquire', k, a)
        WHEN 'acquire_permit_rated' THEN {schema}.rated('acquire_permit', k, a)
        WHEN 'unstart' THEN {schema}.unstart(k, a)
        WHEN 'queue_park' THEN {schema}.queue_park(k, a)
        WHEN 'queue_next' THEN {schema}.queue_next(k, a)
        WHEN 'queue_peek' THEN {schema}.queue_peek(k, a)
    END;
    IF reply IS NULL THEN RAISE EXCEPTION 'no operation %', op; END IF;
    IF op NOT IN ('inspect', 'peek', 'queue_peek') AND random() < 0.125 THEN
        PERFORM {schema}.sweep();
    END IF;
    RETURN reply::text;
END $$;

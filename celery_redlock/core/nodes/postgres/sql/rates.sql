-- The rate reservation (scripts/rates.py): GCRA per window, booked in two
-- phases, and the acquires that book a rated start in their own call.

CREATE OR REPLACE FUNCTION {schema}.tat(key text, field text) RETURNS numeric
LANGUAGE sql AS $$ SELECT coalesce({schema}.num({schema}.r_hget(key, field)), 0); $$;

CREATE OR REPLACE FUNCTION {schema}.rate(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    phase text := a[1];
    now numeric := a[2]::numeric;
    versions text[] := '{}';
    -- the windows, in order: the index of their key, field, T, tau, period
    w_key integer[] := '{}';
    w_field text[] := '{}';
    w_t numeric[] := '{}';
    w_tau numeric[] := '{}';
    w_period numeric[] := '{}';
    ai integer := 4;
    m integer;
    start numeric;
    t numeric;
    tokens text[];
    out jsonb;
    before jsonb := '[]';
    horizon numeric;
    longest numeric;
BEGIN
    FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
        versions := versions || a[ai];
        m := a[ai + 1]::integer;
        ai := ai + 2;
        FOR j IN 1 .. m LOOP
            w_key := w_key || i;
            w_field := w_field || a[ai];
            w_t := w_t || a[ai + 1]::numeric;
            w_tau := w_tau || a[ai + 2]::numeric;
            w_period := w_period || a[ai + 3]::numeric;
            ai := ai + 4;
        END LOOP;
    END LOOP;
    IF phase = '0' THEN
        FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
            IF coalesce({schema}.r_hget(k[i], 'v'), '') <> versions[i] THEN RETURN '[0]'; END IF;
        END LOOP;
        tokens := regexp_split_to_array(btrim(coalesce(a[3], '')), '\s+');
        FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
            FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
                CONTINUE WHEN w_key[j] <> i;
                IF tokens[j] IS NULL OR tokens[j] IN ('-', '') THEN
                    PERFORM {schema}.r_hdel(k[i], w_field[j]);
                ELSE
                    PERFORM {schema}.r_hset(k[i], w_field[j], tokens[j]);
                END IF;
            END LOOP;
            PERFORM {schema}.r_hincrby(k[i], 'v', 1);
        END LOOP;
        RETURN '[1]';
    END IF;
    IF phase = '1' THEN
        start := now;
        FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
            start := greatest(start, {schema}.tat(k[w_key[j]], w_field[j]) - w_tau[j]);
        END LOOP;
        IF a[3] <> '' AND start < a[3]::numeric THEN
            RETURN jsonb_build_array(2, trunc(start)::text);
        END IF;
    ELSE
        start := a[3]::numeric;
        FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
            IF coalesce({schema}.r_hget(k[i], 'v'), '') <> versions[i] THEN phase := '3'; END IF;
        END LOOP;
        IF phase = '3' THEN
            -- another booking came in between: keep mine where it is, and book
            -- s* anew only if GCRA admits it here
            FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
                IF {schema}.tat(k[w_key[j]], w_field[j]) - w_tau[j] > start THEN
                    RETURN '[0]';
                END IF;
            END LOOP;
        END IF;
    END IF;
    out := jsonb_build_array(1, trunc(start)::text);
    FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
        before := before || to_jsonb(coalesce({schema}.r_hget(k[w_key[j]], w_field[j]), '-'));
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(k, 1), 0) LOOP
        horizon := start;
        longest := 0;
        FOR j IN 1 .. coalesce(array_length(w_key, 1), 0) LOOP
            CONTINUE WHEN w_key[j] <> i;
            t := {schema}.tat(k[i], w_field[j]);
            IF phase = '2' THEN t := t - w_t[j]; END IF;
            t := greatest(t, start) + w_t[j];
            PERFORM {schema}.r_hset(k[i], w_field[j], trunc(t)::text);
            horizon := greatest(horizon, t);
            longest := greatest(longest, w_period[j]);
        END LOOP;
        out := out || to_jsonb({schema}.r_hincrby(k[i], 'v', 1));
        PERFORM {schema}.r_pexpire(k[i], trunc(greatest(1, horizon - now + longest))::bigint);
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
        booking := {schema}.rate(k[na + 1 : na + nr], a[o + 8 :]);
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
            starts := k[na + nr + i];
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
    END;
    IF reply IS NULL THEN RAISE EXCEPTION 'no operation %', op; END IF;
    IF op NOT IN ('inspect', 'peek') THEN PERFORM {schema}.sweep(); END IF;
    RETURN reply::text;
END $$;

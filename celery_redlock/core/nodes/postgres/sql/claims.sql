-- Claims and the schedules of coalesced calls (scripts/claims.py).

-- A claim value '~' || id is the started mark: it counts as no claim.
CREATE OR REPLACE FUNCTION {schema}.pending(v text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT CASE WHEN left(v, 1) = '~' THEN NULL ELSE v END; $$;

CREATE OR REPLACE FUNCTION {schema}.claim(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    holder text := {schema}.r_get(k[1]);
BEGIN
    IF holder = a[1] THEN RETURN '1'; END IF;
    IF holder IS NOT NULL THEN RETURN '0'; END IF;
    PERFORM {schema}.r_set(k[1], a[1], a[2]::bigint);
    RETURN '1';
END $$;

CREATE OR REPLACE FUNCTION {schema}.claim_next(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    cur text := {schema}.pending({schema}.r_get(k[1]));
BEGIN
    IF cur = a[1] THEN
        IF {schema}.r_pttl(k[1]) < a[2]::numeric THEN
            PERFORM {schema}.r_pexpire(k[1], a[2]::bigint);
        END IF;
        RETURN '[1, null, 1]';
    END IF;
    IF cur IS NOT NULL AND a[3] IS DISTINCT FROM '1' THEN
        RETURN jsonb_build_array(0, cur, {schema}.r_pttl(k[1]));
    END IF;
    PERFORM {schema}.r_set(k[1], a[1], a[2]::bigint);
    RETURN jsonb_build_array(1, cur, 0);
END $$;

CREATE OR REPLACE FUNCTION {schema}.debounce(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    now numeric := a[2]::numeric;
    previous text := {schema}.pending({schema}.r_get(k[1]));
    first numeric;
    due numeric;
    ttl numeric;
BEGIN
    first := coalesce(CASE WHEN previous IS NOT NULL
                           THEN {schema}.num({schema}.r_get(k[2])) END, now);
    due := now + a[3]::numeric;
    IF a[4] <> '' THEN due := greatest(now, least(due, first + a[4]::numeric)); END IF;
    ttl := due - now + a[5]::numeric;
    PERFORM {schema}.r_set(k[1], a[1], trunc(ttl)::bigint);
    PERFORM {schema}.r_set(k[2], trunc(first)::text, trunc(ttl)::bigint);
    RETURN jsonb_build_array(1, previous, trunc(due)::text);
END $$;

-- Lua's tonumber for the values read back: NULL unless a number.
CREATE OR REPLACE FUNCTION {schema}.num(v text) RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN v ~ '^\s*-?[0-9]+(\.[0-9]*)?\s*$' THEN v::numeric END;
$$;

CREATE OR REPLACE FUNCTION {schema}.throttle(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    now numeric := a[2]::numeric;
    period numeric := a[3]::numeric;
    h text[] := {schema}.r_hmget(k[2], ARRAY['due', 'id', 'start']);
    planned numeric := {schema}.num(h[1]);
    owner text := h[2];
    started numeric := {schema}.num(h[3]);
    due numeric := now;
    base numeric;
    slot text;
BEGIN
    IF planned IS NOT NULL AND planned > now THEN
        due := planned;
    ELSE
        base := greatest(coalesce(planned, -period), coalesce(started, -period));
        IF now < base + period THEN due := base + period; END IF;
    END IF;
    slot := trunc(due)::text;
    IF due > now AND a[4] IS DISTINCT FROM '1' THEN
        RETURN jsonb_build_array(0, owner, slot);
    END IF;
    IF planned IS NOT NULL AND planned > now THEN
        PERFORM {schema}.r_hset(k[2], 'id', a[1]);
        RETURN jsonb_build_array(1, owner, slot);
    END IF;
    PERFORM {schema}.r_hset(k[2], 'pdue', coalesce(h[1], ''), 'pid', coalesce(owner, ''),
                            'due', slot, 'id', a[1]);
    PERFORM {schema}.r_pexpire(k[2], trunc(due - now + period + a[5]::numeric)::bigint);
    IF due > now THEN RETURN jsonb_build_array(1, NULL, slot); END IF;
    RETURN jsonb_build_array(2, NULL, slot);
END $$;

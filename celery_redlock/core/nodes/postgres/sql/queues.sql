-- A name's calls waiting in publish order, and the hand-over (scripts/queues.py).

-- ZRANK k m: the member's 0-based place in Redis's order, or NULL.
CREATE OR REPLACE FUNCTION {schema}.zrank(k text, m text) RETURNS bigint
LANGUAGE sql AS $$
    SELECT r FROM (SELECT member, row_number() OVER () - 1 AS r
                     FROM {schema}.zmembers(k)) z WHERE member = m;
$$;

CREATE OR REPLACE FUNCTION {schema}.queue_park(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    score double precision := (({schema}.typed(k[1], 'z')).map ->> a[1])::double precision;
    floor numeric := {schema}.num(a[5]);
    ticket numeric;
    waiting bigint;
    taken jsonb := '[]'::jsonb;
    other text;
BEGIN
    IF a[6] = '1' THEN
        FOR other IN SELECT member FROM {schema}.zmembers(k[1]) WHERE member <> a[1] LOOP
            PERFORM {schema}.r_zrem(k[1], other);
            PERFORM {schema}.r_hdel(k[2], other);
            taken := taken || to_jsonb(other);
        END LOOP;
    END IF;
    IF score IS NOT NULL THEN
        ticket := score;
    ELSE
        waiting := (SELECT count(*) FROM {schema}.zmembers(k[1]));
        IF a[3]::numeric > 0 AND waiting >= a[3]::numeric THEN
            RETURN jsonb_build_array(0, waiting);
        END IF;
        ticket := coalesce({schema}.num({schema}.r_hget(k[2], '#')), 0) + 1;
        PERFORM {schema}.r_hset(k[2], a[1], a[2]);
    END IF;
    IF floor IS NOT NULL AND floor > ticket THEN ticket := floor; END IF;
    PERFORM {schema}.r_zadd(k[1], ticket::double precision, a[1]);
    IF ticket > coalesce({schema}.num({schema}.r_hget(k[2], '#')), 0) THEN
        PERFORM {schema}.r_hset(k[2], '#', trunc(ticket)::text);
    END IF;
    PERFORM {schema}.r_pexpire(k[1], a[4]::bigint);
    PERFORM {schema}.r_pexpire(k[2], a[4]::bigint);
    RETURN jsonb_build_array(1, {schema}.zrank(k[1], a[1]) + 1, trunc(ticket)::text) || taken;
END $$;

CREATE OR REPLACE FUNCTION {schema}.queue_next(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    out integer := 0;
    claim text;
    held integer := 0;
    head record;
    v text;
BEGIN
    IF a[1] <> '' THEN
        out := {schema}.r_zrem(k[2], a[1]);
        PERFORM {schema}.r_hdel(k[3], a[1]);
    END IF;
    IF a[3] = '' THEN RETURN jsonb_build_array(out, 4); END IF;
    claim := {schema}.r_get(k[1]);
    IF claim IS NOT NULL AND left(claim, 1) <> '~'
       AND EXISTS (SELECT 1 FROM {schema}.zmembers(k[2]) WHERE member = claim) THEN
        RETURN jsonb_build_array(out, 0, claim, {schema}.r_pttl(k[1]));
    END IF;
    SELECT member, score INTO head FROM {schema}.zmembers(k[2]) LIMIT 1;
    IF NOT FOUND THEN RETURN jsonb_build_array(out, 2); END IF;
    FOR i IN 4 .. array_length(k, 1) LOOP
        v := {schema}.r_get(k[i]);
        IF v IS NOT NULL AND v IS DISTINCT FROM a[2] THEN held := held + 1; END IF;
    END LOOP;
    IF held >= array_length(k, 1) - 3 THEN RETURN jsonb_build_array(out, 1, held); END IF;
    PERFORM {schema}.r_set(k[1], head.member, a[3]::bigint);
    PERFORM {schema}.r_pexpire(k[2], a[4]::bigint);
    PERFORM {schema}.r_pexpire(k[3], a[4]::bigint);
    RETURN jsonb_build_array(out, 3, head.member, coalesce({schema}.r_hget(k[3], head.member), ''),
                             trunc(head.score)::bigint::text,
                             (SELECT count(*) FROM {schema}.zmembers(k[2])));
END $$;

CREATE OR REPLACE FUNCTION {schema}.queue_peek(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    head record;
BEGIN
    SELECT member, score INTO head FROM {schema}.zmembers(k[1]) LIMIT 1;
    IF NOT FOUND THEN RETURN '[0, null, null, null]'; END IF;
    RETURN jsonb_build_array((SELECT count(*) FROM {schema}.zmembers(k[1])), head.member,
                             {schema}.r_hget(k[2], head.member), trunc(head.score)::bigint::text);
END $$;

-- The permits' acquire (scripts/permits.py): one of K keys of a name, and of
-- other names held together, all or nothing.

-- Among one name's permit keys: the one mine, the preferred one if free, the
-- lowest free one (key, idx); or none to take (key NULL): the holder that
-- stops me (busy) and its pttl (remaining).
CREATE OR REPLACE FUNCTION {schema}.pick(keys text[], prefer integer, owner text, copy text,
                                         OUT key text, OUT idx integer, OUT busy text,
                                         OUT remaining bigint)
LANGUAGE plpgsql AS $$
DECLARE
    h text;
    p bigint;
BEGIN
    idx := 0;
    remaining := 0;
    FOR i IN 1 .. coalesce(array_length(keys, 1), 0) LOOP
        h := {schema}.r_get(keys[i]);
        IF h = owner THEN key := keys[i]; idx := i - 1; busy := NULL; RETURN; END IF;
        IF h IS NULL THEN
            IF key IS NULL OR i - 1 = prefer THEN key := keys[i]; idx := i - 1; END IF;
        ELSE
            p := {schema}.r_pttl(keys[i]);
            IF copy IS NOT NULL AND starts_with(h, copy) THEN
                key := NULL; busy := h; remaining := p; RETURN;
            END IF;
            IF busy IS NULL OR p < remaining THEN busy := h; remaining := p; END IF;
        END IF;
    END LOOP;
    IF key IS NOT NULL THEN busy := NULL; END IF;
END $$;

CREATE OR REPLACE FUNCTION {schema}.acquire_permit(k text[], a text[]) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    copy text := CASE WHEN a[5] <> '' THEN a[5] || '|' END;
    g record;
    stop jsonb;
    also boolean := {schema}.flag(a, 'a');
    n integer;
    mine text[];
    p record;
    q record;
    extra_f text[] := '{}';
    extra_k text[] := '{}';
    extra_i integer[] := '{}';
    pos integer;
    ai integer;
    fenced boolean := a[3] <> '';
    out jsonb;
BEGIN
    g := {schema}.gate_enter(k, a);
    IF g.stop IS NOT NULL THEN RETURN g.stop; END IF;
    n := CASE WHEN also THEN a[11]::integer ELSE array_length(k, 1) - 4 END;
    mine := ARRAY[k[1]] || coalesce(k[6 : 4 + n], '{}');
    p := {schema}.pick(mine, nullif(a[10], '')::integer, a[1], copy);
    IF p.key IS NULL THEN RETURN jsonb_build_array(0, p.busy, p.remaining, g.claim); END IF;
    stop := {schema}.gate_free(k, a, g.claim);
    IF stop IS NOT NULL THEN RETURN stop; END IF;
    IF also THEN
        pos := 4 + n;
        ai := 12;
        WHILE a[ai] IS NOT NULL LOOP
            q := {schema}.pick(k[pos + 2 : pos + 1 + a[ai]::integer],
                               nullif(a[ai + 1], '')::integer, a[1], copy);
            IF q.key IS NULL THEN
                RETURN jsonb_build_array(5, coalesce(array_length(extra_k, 1), 0) + 1,
                                         q.busy, q.remaining);
            END IF;
            extra_f := extra_f || k[pos + 1];
            extra_k := extra_k || q.key;
            extra_i := extra_i || q.idx;
            pos := pos + 1 + a[ai]::integer;
            ai := ai + 2;
        END LOOP;
    END IF;
    PERFORM {schema}.r_set(p.key, a[1], a[2]::bigint);
    PERFORM {schema}.gate_granted(k, a, g.claim);
    out := jsonb_build_array(1, CASE WHEN fenced THEN {schema}.advance(k[2], false, a) END,
                             p.idx);
    FOR j IN 1 .. coalesce(array_length(extra_k, 1), 0) LOOP
        PERFORM {schema}.r_set(extra_k[j], a[1], a[2]::bigint);
        out := out || jsonb_build_array(
            CASE WHEN fenced THEN {schema}.advance(extra_f[j], false, a) END, extra_i[j]);
    END LOOP;
    RETURN out;
END $$;

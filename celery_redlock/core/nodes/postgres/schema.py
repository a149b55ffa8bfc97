"""The SQL of a PostgreSQL lock node: its tables and the functions that run the
operations, in a schema of its own (``redlock`` unless the URL says
``?schema=``), and the version that schema is at.

The SQL files beside this module hold the text, with ``{schema}`` where the
schema's name goes: ``storage.sql`` (keys with Redis's semantics on the
server's clock), then one file per primitive, each operation written as the
Lua script of the same name (:mod:`celery_redlock.core.nodes.scripts`).
"""

from __future__ import annotations

from importlib import resources

__all__ = ["REVISION", "VERSION", "check_sql", "ddl", "install_sql"]

#: The schema's version: its tables, keys and the functions' names, arguments and
#: replies, what the releases that share a node must agree on. A node whose
#: schema is at another version is refused.
VERSION = 4

#: The functions' bodies within the version: a node behind it is brought up to
#: it (the DDL again), one ahead is used as it is. Releases of one version run
#: side by side on a node, on whichever bodies it holds: the same rows and
#: locks, so they exclude each other and share the fence values. Revision 1:
#: every grant's fence value is at least the node's clock (ADVANCE).
REVISION = 1

_FILES = ("storage.sql", "lease.sql", "permits.sql", "claims.sql", "queues.sql", "rates.sql")


def ddl(schema: str = "redlock") -> str:
    """The whole DDL of a node's schema (idempotent: applying it twice changes nothing)."""
    text = "\n".join(
        resources.files(__package__).joinpath(f"sql/{name}").read_text() for name in _FILES
    )
    meta = (
        "DELETE FROM {schema}.meta;\n"
        f"INSERT INTO {{schema}}.meta (version, revision) VALUES ({VERSION}, {REVISION});\n"
    )
    return (text + "\n" + meta).replace("{schema}", schema)


def install_sql(schema: str) -> str:
    """:func:`ddl` in one transaction, one installer at a time."""
    return (
        "BEGIN;\nSELECT pg_advisory_xact_lock(hashtextextended('celery_redlock schema', 0));\n"
        + ddl(schema)
        + "COMMIT;\n"
    )


def check_sql(schema: str) -> str:
    """One row: [the schema's version or null, its revision, synchronous_standby_names].

    A schema made before the revision column reads as revision 0."""
    meta = f"to_regclass('{schema}.meta')"
    with_revision = (
        f"EXISTS (SELECT FROM pg_attribute WHERE attrelid = {meta} "
        "AND attname = 'revision' AND NOT attisdropped)"
    )
    query = (
        f"CASE WHEN {meta} IS NULL THEN 'SELECT NULL::int AS v, 0 AS r' "
        f"WHEN {with_revision} "
        f"THEN 'SELECT max(version) AS v, max(revision) AS r FROM {schema}.meta' "
        f"ELSE 'SELECT max(version) AS v, 0 AS r FROM {schema}.meta' END"
    )
    return (
        "SELECT jsonb_build_array((xpath('/table/row/v/text()', x))[1]::text::int, "
        "coalesce((xpath('/table/row/r/text()', x))[1]::text::int, 0), "
        "current_setting('synchronous_standby_names')) "
        f"FROM (SELECT query_to_xml({query}, false, false, '') AS x) AS meta"
    )

"""The SQL of a PostgreSQL lock node: its tables and the functions that run the
operations, in a schema of its own (``redlock`` unless the URL says
``?schema=``), and the version that schema is at.

The SQL files beside this module hold the text, with ``{schema}`` where the
schema's name goes: ``storage.sql`` (keys with Redis's semantics on the
server's clock), then one file per primitive, each operation written as the
Lua script of the same name (:mod:`celery_redlock.core.scripts`).
"""

from __future__ import annotations

from importlib import resources

__all__ = ["VERSION", "check_sql", "ddl", "install_sql"]

#: The schema's version: a node whose schema is at another one is refused.
VERSION = 4

_FILES = ("storage.sql", "lease.sql", "permits.sql", "claims.sql", "queues.sql", "rates.sql")


def ddl(schema: str = "redlock") -> str:
    """The whole DDL of a node's schema (idempotent: applying it twice changes nothing)."""
    text = "\n".join(
        resources.files(__package__).joinpath(f"sql/{name}").read_text() for name in _FILES
    )
    meta = (
        f"DELETE FROM {{schema}}.meta;\nINSERT INTO {{schema}}.meta (version) VALUES ({VERSION});\n"
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
    """One row: [the schema's version or null, synchronous_standby_names]."""
    version = (
        f"CASE WHEN to_regclass('{schema}.meta') IS NULL THEN 'SELECT NULL::int AS v' "
        f"ELSE 'SELECT max(version) AS v FROM {schema}.meta' END"
    )
    return (
        "SELECT jsonb_build_array((xpath('/table/row/v/text()', "
        f"query_to_xml({version}, false, false, '')))[1]::text::int, "
        "current_setting('synchronous_standby_names'))"
    )

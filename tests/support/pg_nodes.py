"""PostgreSQL lock nodes for tests: throwaway databases on the tests' own server
(:mod:`tests.support.postgres`) as ``postgresql://`` URLs, and a comparison of a
PostgreSQL node's replies with a Redis node's."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tests.support.postgres import address, require, throwaway_database, unreachable

__all__ = ["pg_urls", "same_reply", "url_of"]

#: ms two servers' TTLs may differ by: the two calls that wrote a key, and the two
#: that read it, are a few ms apart, and a loaded machine stretches both (a
#: busy two-core host reached 278 ms).
TTL_SLACK = 750


def url_of(dbname: str, user: str = "postgres", **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in options.items())
    host, port = address()
    return f"postgresql://{user}@{host}:{port}/{dbname}" + (f"?{query}" if query else "")


@contextlib.contextmanager
def pg_urls(n: int = 1, **options: str) -> Iterator[list[str]]:
    """``n`` throwaway databases as node URLs (skipped where the server is missing)."""
    require(unreachable())
    with contextlib.ExitStack() as stack:
        names = [stack.enter_context(throwaway_database()) for _ in range(n)]
        yield [url_of(name, **options) for name in names]


def same_reply(redis_reply: Any, pg_reply: Any, where: str = "", slack: float = TTL_SLACK) -> None:
    """Assert two replies are the same: equal values, TTLs (ints above 10)
    within ``slack`` ms (:data:`TTL_SLACK`), and an error against an error."""
    if isinstance(redis_reply, Exception) or isinstance(pg_reply, Exception):
        assert isinstance(redis_reply, Exception) and isinstance(pg_reply, Exception), (
            f"{where}: redis {redis_reply!r} != postgres {pg_reply!r}"
        )
        return
    assert type(redis_reply) is type(pg_reply), f"{where}: redis {redis_reply!r} != {pg_reply!r}"
    if isinstance(redis_reply, list):
        assert len(redis_reply) == len(pg_reply), f"{where}: redis {redis_reply!r} != {pg_reply!r}"
        for i, (a, b) in enumerate(zip(redis_reply, pg_reply)):
            same_reply(a, b, f"{where}[{i}]", slack)
    elif isinstance(redis_reply, int) and redis_reply > 10 and pg_reply > 10:
        assert abs(redis_reply - pg_reply) <= slack, f"{where}: {redis_reply} != {pg_reply}"
    else:
        assert redis_reply == pg_reply, f"{where}: redis {redis_reply!r} != postgres {pg_reply!r}"

"""The URL forms of a node, and the fail-fast client each one gives.

A node is ``redis://``, ``rediss://`` or ``unix://`` (redis-py's grammar) or
``sentinel://`` (:func:`sentinel_options`). :func:`client_for` turns one into
a ``redis.Redis`` whose connections fail fast: a small socket and connect
timeout and **no client-side retries** (redis-py 8 retries ten times by
default, which turns a dead node into a multi-second stall and re-sends
commands that are not idempotent).

A ``sentinel://`` node is a client from redis-py's public
``redis.sentinel.Sentinel.master_for``: each new connection asks the sentinels
(all at once: :class:`~celery_redlock.core.nodes.redis.sentinels.Sentinels`) where the
master is, so after a failover the connection that fails is dropped and the
next one reaches the new master.

:func:`mask_url` hides the passwords of URLs in messages and logs.
"""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import redis

from ...exceptions import ConfigurationError
from .. import mask_url
from .sentinels import Sentinels

__all__ = [
    "SCHEMES",
    "SENTINEL_PORT",
    "address",
    "client_for",
    "describe",
    "mask_url",
    "sentinel_options",
]

# "Send no CLIENT SETINFO on connect": redis-py 8 spells it driver_info=None
# (and deprecates lib_name/lib_version), 5 to 7 only know lib_name/lib_version.
_NO_CLIENT_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)

#: The URL schemes of a node.
SCHEMES = ("redis", "rediss", "unix", "sentinel")


def client_for(url: str, timeout: float, connect_timeout: float | None = None) -> redis.Redis:
    """A client of the node ``url`` names, failing fast.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://`` or ``sentinel://``.
        timeout: socket timeout in seconds.
        connect_timeout: connect timeout in seconds (also the sentinels'
            timeouts: asking them is part of opening a connection); None:
            ``timeout``.

    Raises:
        ConfigurationError: the URL is not one of these, or does not parse.
    """
    scheme = urlsplit(url).scheme
    if scheme not in SCHEMES:
        raise ConfigurationError(
            f"Redis node URL {mask_url(url)!r} must start with one of "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    if url.count("://") > 1:  # "redis://a;redis://b" would connect to a alone
        raise ConfigurationError(
            f"Redis node URL {mask_url(url)!r} holds a second URL: give each node "
            "as a URL of its own"
        )
    connect_timeout = timeout if connect_timeout is None else connect_timeout
    fail_fast = dict(
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        retry=None,
        health_check_interval=0,
        # RESP2 and no CLIENT SETINFO: a new connection costs no
        # extra round trip, so a hung node cannot stall a connect.
        protocol=2,
        **_NO_CLIENT_SETINFO,
    )
    try:
        if scheme == "sentinel":
            return _sentinel_master(url, fail_fast, connect_timeout)
        return redis.Redis.from_url(url, **fail_fast)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"Redis node URL {mask_url(url)!r}: {exc}") from exc


# -- Sentinel-managed nodes ---------------------------------------------------------------------

#: The port of a sentinel given without one.
SENTINEL_PORT = 26379

#: Query options of a ``sentinel://`` URL: TLS (to the master and the sentinels
#: alike), the sentinels' own AUTH, and redis-py's ``min_other_sentinels``.
_SENTINEL_QUERY = {
    "db": int,
    "ssl": "flag",
    "ssl_ca_certs": str,
    "ssl_ca_path": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": "flag",
    "sentinel_username": str,
    "sentinel_password": str,
    "min_other_sentinels": int,
}


def sentinel_options(url: str) -> dict[str, Any]:
    """What a ``sentinel://`` URL says.

    The grammar::

        sentinel://[[username]:password@]host[:port][,host[:port]...]/service[/db][?options]

    * the hosts are the sentinels (port 26379 when omitted), separated by commas;
    * ``service`` is the master's name in the sentinels (``sentinel monitor <service> ...``);
    * ``username``/``password`` and ``db`` are the master's (and its replicas');
    * options: ``db=N``; ``ssl=true`` and redis-py's ``ssl_ca_certs``,
      ``ssl_ca_path``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_cert_reqs``
      (``none``/``optional``/``required``), ``ssl_check_hostname``, which apply
      to the master and the sentinels alike (any ``ssl_*`` option turns TLS on);
      ``sentinel_username``/``sentinel_password`` for sentinels that require
      AUTH of their own; ``min_other_sentinels``.

    Returns:
        ``{"sentinels": [(host, port), ...], "service": str, "master": {...},
        "sentinel": {...}, "min_other_sentinels": int}``: the connection
        options of the master and of the sentinels.

    Raises:
        ValueError: the URL does not follow the grammar.
    """
    parts = urlsplit(url)
    if parts.scheme != "sentinel":
        raise ValueError("a Sentinel URL starts with sentinel://")
    userinfo, _, hostlist = parts.netloc.rpartition("@")
    sentinels = []
    for item in hostlist.split(","):
        host, port = _host_port(item.strip())
        sentinels.append((host, port))
    path = [unquote(p) for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError("the path must be /service or /service/db (the master's name)")
    master: dict[str, Any] = {}
    sentinel: dict[str, Any] = {}
    if userinfo:
        username, has_password, password = userinfo.partition(":")
        if username:
            master["username"] = unquote(username)
        if has_password:
            master["password"] = unquote(password)
    if len(path) == 2:
        master["db"] = _integer("db", path[1])
    others = 0
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        kind = _SENTINEL_QUERY.get(name)
        if kind is None:
            raise ValueError(
                f"unknown option {name!r}; known: " + ", ".join(sorted(_SENTINEL_QUERY))
            )
        if name == "db":
            master["db"] = _integer(name, value)
        elif name == "min_other_sentinels":
            others = _integer(name, value)
        elif name.startswith("sentinel_"):
            sentinel[name[len("sentinel_") :]] = value
        elif kind == "flag":
            flag = value.lower()
            if flag not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"option {name!r} must be true or false, not {value!r}")
            master[name] = flag in ("true", "1", "yes")
        else:
            master[name] = value
    tls = {k: v for k, v in master.items() if k.startswith("ssl")}
    if any(k != "ssl" for k in tls) and "ssl" not in tls:
        tls["ssl"] = master["ssl"] = True
    if tls.get("ssl"):
        sentinel.update(tls)
    else:
        for k in tls:
            master.pop(k)
    return {
        "sentinels": sentinels,
        "service": path[0],
        "master": master,
        "sentinel": sentinel,
        "min_other_sentinels": others,
    }


def _host_port(item: str) -> tuple[str, int]:
    if not item:
        raise ValueError("an empty sentinel address")
    if item.startswith("["):  # [ipv6]:port
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = item.partition(":")
    if not host:
        raise ValueError(f"sentinel address {item!r} has no host")
    return host, _integer("port", port) if port else SENTINEL_PORT


def _integer(name: str, text: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{name} must be a whole number, not {text!r}")
    return int(text)


def _sentinel_master(url: str, fail_fast: dict[str, Any], connect_timeout: float) -> redis.Redis:
    """A client of the master that the sentinels of ``url`` name, through redis-py's Sentinel.

    The master is looked up when a connection is opened, so after a failover
    the next new connection reaches the new master. The sentinels are asked
    within the node's connect timeout, all at once
    (:class:`~celery_redlock.core.nodes.redis.sentinels.Sentinels`).
    """
    options = sentinel_options(url)
    asking = {**fail_fast, "socket_timeout": connect_timeout}
    sentinel = Sentinels(
        options["sentinels"],
        min_other_sentinels=options["min_other_sentinels"],
        sentinel_kwargs={**asking, **options["sentinel"]},
        **fail_fast,
        **options["master"],
    )
    return sentinel.master_for(options["service"])


def address(kw: dict[str, Any]) -> tuple[str, int]:
    """``(host, port)`` of a connection's keyword arguments, redis-py's defaults filled in."""
    return kw.get("host") or "localhost", int(kw.get("port") or 6379)


def describe(client: redis.Redis) -> str:
    """A URL that names the server of ``client`` (it has no password)."""
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"

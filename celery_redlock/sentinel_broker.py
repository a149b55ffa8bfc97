"""The lock node a Celery Sentinel broker names, as one ``sentinel://`` node URL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

__all__ = ["sentinel_node"]

#: The TLS options of ``broker_use_ssl`` that a ``sentinel://`` node URL carries.
_SSL_OPTIONS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def sentinel_node(broker: str, options: Mapping[str, Any], use_ssl: Any) -> str:
    """Celery's Sentinel broker URL (``sentinel://h1:26379;sentinel://h2:26379``),
    its ``broker_transport_options`` (with ``master_name``) and ``broker_use_ssl``
    as one ``sentinel://h1:26379,h2:26379/<master_name>`` node URL: the password
    and db of its first URL, the sentinels' password from ``sentinel_kwargs``."""
    service = options["master_name"]
    hosts, userinfo, db = [], "", ""
    for i, url in enumerate(u.strip() for u in broker.split(";") if u.strip()):
        parts = urlsplit(url)
        if parts.scheme != "sentinel":
            continue
        info, _, hostport = parts.netloc.rpartition("@")
        hosts.append(hostport)
        if i == 0:
            userinfo = f"{info}@" if info else ""
            db = parts.path.strip("/")
    query: dict[str, Any] = {}
    sentinel_kwargs = options.get("sentinel_kwargs") or {}
    for name in ("username", "password"):
        if sentinel_kwargs.get(name):
            query[f"sentinel_{name}"] = sentinel_kwargs[name]
    if options.get("min_other_sentinels"):
        query["min_other_sentinels"] = options["min_other_sentinels"]
    if use_ssl:
        query["ssl"] = "true"
        if isinstance(use_ssl, Mapping):
            for name in _SSL_OPTIONS:
                value = use_ssl.get(name)
                if value is not None:
                    query[name] = _ssl_text(value)
    url = f"sentinel://{userinfo}{','.join(hosts)}/{quote(str(service), safe='')}"
    if db.isdigit():
        url += f"/{db}"
    return url + (f"?{urlencode(query)}" if query else "")


def _ssl_text(value: Any) -> str:
    # ssl.CERT_REQUIRED and friends, as redis-py's URL options spell them.
    names = {0: "none", 1: "optional", 2: "required"}
    return names.get(value, str(value)) if isinstance(value, int) else str(value)

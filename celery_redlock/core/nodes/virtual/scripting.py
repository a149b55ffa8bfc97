"""The operations' own Lua, run in this process on a :class:`~.keyspace.View`.

A kind that runs no code of ours (etcd, memory) runs each operation's Lua
script, the Redis kind's implementation (:mod:`celery_redlock.core.nodes.scripts`),
in an embedded Lua 5.1 (lupa, Redis's Lua version), its ``redis.call``
answered by the view of the keys the call read. The reply is converted as
Redis converts a script's reply (numbers to integers, ``false`` to nil, a
table to a list up to its first nil).

Why the very Lua, not a Python rewrite of the operations: the script text is
the one specification every kind is held to, so a virtual node answers each
operation with a Redis node's values by construction; what is left to get
right here is the 21 Redis commands the scripts call (:mod:`.keyspace`), which
the differential test runs on every kind, and never a second copy of the
gates, fences, permits, claims, rates and queues that would drift from the
first. :func:`.store.execute` makes a run atomic: its writes land only if the
keys it read are still at the versions it read.
"""

from __future__ import annotations

import threading
from typing import Any

from ...exceptions import ConfigurationError
from .keyspace import ScriptError, View

__all__ = ["run_script", "warm"]

#: What to install where lupa is missing.
NEEDS_LUPA = (
    "{kind} lock nodes run the operations' Lua in this process and need lupa: "
    "pip install 'celery_redlock[{kind}]'"
)

_PRELUDE = """
redis = {}
local call = ...
local function reply(r)
  if type(r) == 'table' and r.err then error(r.err, 0) end
  return r
end
function redis.call(...) return reply(call(...)) end
function redis.pcall(...) return call(...) end
function redis.error_reply(msg) return {err = msg} end
function redis.status_reply(msg) return {ok = msg} end
"""

_local = threading.local()


def _runtime() -> Any:
    lua = getattr(_local, "lua", None)
    if lua is None:
        from lupa import lua51

        lua = lua51.LuaRuntime(encoding=None, register_eval=False, unpack_returned_tuples=False)
        lua.execute(_PRELUDE, lua.eval("function(...) return _G._py_call(...) end"))
        _local.lua, _local.compiled, _local.view = lua, {}, None
        lua.globals()._py_call = _dispatch
    return lua


def warm(kind: str) -> None:
    """Make this thread's Lua runtime now (about 0.1 s), not at the first call: a
    node made in a prefork worker's parent hands it to every child it forks.

    Raises:
        ConfigurationError: lupa is not installed, naming the extra that brings it.
    """
    try:
        _runtime()
    except ImportError:
        raise ConfigurationError(NEEDS_LUPA.format(kind=kind)) from None


def _arg(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, float):
        return (str(int(value)) if value.is_integer() else f"{value:.17g}").encode()
    return str(value).encode()


def _to_lua(lua: Any, value: Any) -> Any:
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) if v is not None else False for v in value])
    if isinstance(value, dict):
        return lua.table_from(value)
    if value is None:
        return False
    return value


def _dispatch(name: Any, *args: Any) -> Any:
    view: View = _local.view
    lua = _local.lua
    try:
        return _to_lua(lua, view.call(_arg(name), [_arg(a) for a in args]))
    except ScriptError as exc:
        return lua.table_from({b"err": str(exc).encode()})


def _from_lua(value: Any) -> Any:
    if value is None or value is False:
        return None
    if value is True:
        return 1
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, bytes):
        return value
    # a table
    err = value[b"err"]
    if err is not None:
        raise ScriptError(err.decode(errors="replace"))
    ok = value[b"ok"]
    if ok is not None:
        return ok
    out = []
    i = 1
    while value[i] is not None:
        out.append(_from_lua(value[i]))
        i += 1
    return out


def _compiled(lua: Any, name: str, source: str) -> Any:
    fn = _local.compiled.get(name)
    if fn is None:
        fn = lua.execute(f"return function(KEYS, ARGV)\n{source}\nend")
        _local.compiled[name] = fn
    return fn


def run_script(op: Any, view: View, keys: list[bytes], args: list[bytes]) -> Any:
    """Run ``op``'s Lua on ``view``: its reply, with Redis's conversions.

    Raises:
        ScriptError: the script's error (a command's, or its own ``error()``).
    """
    from lupa import LuaError

    lua = _runtime()
    fn = _compiled(lua, op.sha, op.text)
    _local.view = view
    try:
        result = fn(lua.table_from(keys), lua.table_from(args))
    except LuaError as exc:
        raise ScriptError(str(exc)) from None
    finally:
        _local.view = None
    return _from_lua(result)

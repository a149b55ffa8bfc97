"""The tools reach the lock core through its public API only.

No module outside the core imports the core's inner modules (it imports
:mod:`celery_redlock.core` itself, or its ``heartbeat`` and ``exceptions``;
never the node seam, :mod:`celery_redlock.core.nodes`), and no module imports
a leading-underscore name from another module. Above the node seam (and
outside ``testing``) no module sends a Redis command, imports redis-py or
tests a node's kind by its name: the kinds' differences live under the seam. The
tools' subpackages keep their own layers: the dashboard (``web``) shares the
tools' reading and formatting modules with the CLI but none of the CLI's
commands, and ``testing`` needs nothing of the package (but the kind of the
nodes that live in the test process, ``memory://``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import celery_redlock

PACKAGE = Path(celery_redlock.__file__).parent


def _dotted(path: Path) -> str:
    """``task``, ``cli.status``, ``core.nodes.scripts`` (a package by its own name)."""
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")


PATHS = {_dotted(p): p for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "__init__.py"}
MODULES = sorted(PATHS)
CORE = {"redlock", "exceptions", "metrics", "settings"} | {
    m for m in MODULES if m == "core" or m.startswith("core.")
}
#: The core's modules that only the core imports: everything but its package,
#: its heartbeat and its exceptions (the tools read the nodes through the package).
PUBLIC_CORE = {"core", "core.heartbeat", "core.exceptions"}
INNER = {m for m in MODULES if m.startswith("core.")} - PUBLIC_CORE
#: A test helper that drives nodes living in the test process itself imports
#: their kind: a memory node's store and fault hooks are reachable only there.
IN_PROCESS = {"testing.memory": {"core.nodes.memory"}}


#: The modules above the node seam: all but the seam's own and the test helpers.
ABOVE_THE_SEAM = [
    m for m in MODULES if not m.startswith(("core.nodes.", "testing")) and m != "core.nodes"
]
#: Redis's commands (the first word of a command tuple).
REDIS_COMMANDS = {
    "CLIENT", "CLUSTER", "CONFIG", "DEL", "EVAL", "EVALSHA", "EXEC", "EXISTS", "EXPIRE",
    "FLUSHALL", "FLUSHDB", "GET", "HGET", "HGETALL", "HSET", "INCR", "INFO", "KEYS", "MGET",
    "MULTI", "PEXPIRE", "PING", "PTTL", "ROLE", "SCAN", "SCRIPT", "SET", "TTL", "TYPE",
    "WAIT", "ZADD", "ZRANGE",
}  # fmt: skip
#: Two or more HTTP methods (the dashboard's ``("GET", "HEAD")``) are no command.
HTTP_METHODS = {"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}
#: The kinds' names (a node's ``kind``).
KIND_NAMES = {"redis", "postgres", "etcd", "zookeeper", "memory"}


def _words(node: ast.AST) -> list[str]:
    """The string constants ``node`` is, or holds (a tuple, list or set of them)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def _is_kind(node: ast.AST) -> bool:
    """``kind`` or ``x.kind`` (a broker URL's scheme compared with "redis" is no kind)."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name == "kind"


def seam_crossings(source: str) -> list[str]:
    """What in ``source`` belongs under the node seam: a Redis command tuple, an
    import of redis-py, a comparison with a kind's name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Tuple) and node.elts:
            first, words = _words(node.elts[0]), _words(node)
            http = len(words) == len(node.elts) > 1 and set(words) <= HTTP_METHODS
            if first and first[0] in REDIS_COMMANDS and not http:
                found.append(f"line {node.lineno}: the Redis command {first[0]!r}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "redis":
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "redis":
                found.append(f"line {node.lineno}: from {node.module} import")
        elif isinstance(node, ast.Compare):
            sides = (node.left, *node.comparators)
            named = {w for side in sides for w in _words(side)}
            if named & KIND_NAMES and any(map(_is_kind, sides)):
                found.append(f"line {node.lineno}: the kind {sorted(named & KIND_NAMES)[0]!r}")
    return found


def imports(module: str) -> list[tuple[str, str]]:
    """(module imported from, name) of every import from inside the package, as dotted
    names inside it: ``from ..core import Redlock`` in ``cli.status`` is ``("core", "Redlock")``,
    ``from . import conf`` in ``task`` is ``("", "conf")``."""
    path = PATHS[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        if node.level:
            base = package[: len(package) - node.level + 1]
            source = ".".join(base + ([node.module] if node.module else []))
        elif (node.module or "").startswith("celery_redlock"):
            source = (node.module or "").partition(".")[2]
        else:
            continue
        found += [(source, alias.name) for alias in node.names]
    return found


def modules_imported(module: str) -> set[str]:
    """The package's modules ``module`` imports (``from . import x`` counts ``x``)."""
    found = set()
    for source, name in imports(module):
        found.add(source)
        if f"{source}.{name}".lstrip(".") in PATHS:
            found.add(f"{source}.{name}".lstrip("."))
    return found - {""}


def test_the_walk_resolves_relative_imports_in_subpackages():
    assert ("core", "Redlock") in imports("cli.locks")
    assert ("cli.base", "command") in imports("cli.status")
    assert ("_format", "glob_escape") in imports("web.pager")
    assert ("", "signals") in imports("task")
    assert {"cli.status", "cli.web"} <= modules_imported("cli")
    assert "core.lease" in INNER and "core.nodes.scripts" in INNER and "cli.base" in MODULES
    assert "core.nodes.redis.wire" in INNER and "core.connect" in INNER


@pytest.mark.parametrize("module", [m for m in MODULES if m not in CORE])
def test_no_module_outside_the_core_imports_its_private_modules(module):
    inner = INNER - IN_PROCESS.get(module, set())
    for source, name in imports(module):
        assert source not in inner, f"{module} imports {name} from {source}"
        assert f"{source}.{name}".lstrip(".") not in INNER, f"{module} imports {name}"


@pytest.mark.parametrize("module", MODULES)
def test_no_leading_underscore_name_is_imported_across_modules(module):
    for source, name in imports(module):
        private_module = f"{source}.{name}".lstrip(".") in PATHS
        assert not name.startswith("_") or private_module, f"{module} imports {name} from {source}"


def test_the_seam_check_finds_commands_redis_and_kinds_by_name():
    assert seam_crossings('reply = command(nodes, ("PING",), 1.0)')
    assert seam_crossings('ask(("SCAN", 0, "MATCH", m, "COUNT", 10), [node])')
    assert seam_crossings("_VALUE_OF = {'hash': ('HGETALL',)}")
    assert seam_crossings("from redis.exceptions import RedisError")
    assert seam_crossings("import redis")
    assert seam_crossings('noun = "standby" if p.kind == "postgres" else "replica"')
    assert seam_crossings('if kind in ("etcd", "zookeeper"): pass')
    assert not seam_crossings('if method in ("GET", "HEAD"): pass')
    assert not seam_crossings('family = ("lock", "fence")')
    assert not seam_crossings('if scheme in ("redis", "rediss"): pass')  # the broker's


@pytest.mark.parametrize("module", ABOVE_THE_SEAM)
def test_nothing_above_the_node_seam_names_a_command_redis_or_a_kind(module):
    found = seam_crossings(PATHS[module].read_text())
    assert not found, f"{module}: {'; '.join(found)}"


@pytest.mark.parametrize("module", [m for m in MODULES if m == "web" or m.startswith("web.")])
def test_the_dashboard_imports_no_command_of_the_cli(module):
    cli = {m for m in modules_imported(module) if m == "cli" or m.startswith("cli.")}
    assert not cli, f"{module} imports {sorted(cli)}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.split(".")[0] == "testing"])
def test_the_test_helpers_need_nothing_of_the_package(module):
    outside = {m for m in modules_imported(module) if m.split(".")[0] != "testing"}
    outside -= IN_PROCESS.get(module, set())
    assert not outside, f"{module} imports {sorted(outside)}"

"""The tools reach the lock core through its public API only.

No module outside the core imports the core's inner modules (it imports
:mod:`celery_redlock.core` itself, or its ``heartbeat`` and ``exceptions``),
and no module imports a leading-underscore name from another module. The
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
#: its heartbeat, its exceptions and the node seam (kinds and tools meet there).
PUBLIC_CORE = {"core", "core.heartbeat", "core.exceptions", "core.nodes"}
INNER = {m for m in MODULES if m.startswith("core.")} - PUBLIC_CORE
#: A test helper that drives nodes living in the test process itself imports
#: their kind: a memory node's store and fault hooks are reachable only there.
IN_PROCESS = {"testing.memory": {"core.nodes.memory"}}


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


@pytest.mark.parametrize("module", [m for m in MODULES if m == "web" or m.startswith("web.")])
def test_the_dashboard_imports_no_command_of_the_cli(module):
    cli = {m for m in modules_imported(module) if m == "cli" or m.startswith("cli.")}
    assert not cli, f"{module} imports {sorted(cli)}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.split(".")[0] == "testing"])
def test_the_test_helpers_need_nothing_of_the_package(module):
    outside = {m for m in modules_imported(module) if m.split(".")[0] != "testing"}
    outside -= IN_PROCESS.get(module, set())
    assert not outside, f"{module} imports {sorted(outside)}"

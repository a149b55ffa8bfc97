"""The tools reach the lock core through its public API only.

No module outside the core imports ``_nodes`` or ``_scripts``, and no module
imports a leading-underscore name from another module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import celery_redlock

PACKAGE = Path(celery_redlock.__file__).parent
CORE = {"redlock", "_connect", "_nodes", "_scripts", "heartbeat", "exceptions", "metrics"}
MODULES = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def imports(module: str) -> list[tuple[str, str]]:
    """(module imported from, name) of every ``from . import`` / ``from .x import`` in a module."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("celery_redlock"):
            sub = (node.module or "").partition(".")[2]
            found += [(sub, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("module", [m for m in MODULES if m not in CORE])
def test_no_module_outside_the_core_imports_its_private_modules(module):
    for source, name in imports(module):
        assert source not in ("_connect", "_nodes", "_scripts"), (
            f"{module} imports {name} from {source}"
        )
        assert name not in ("_connect", "_nodes", "_scripts"), f"{module} imports {name}"


@pytest.mark.parametrize("module", MODULES)
def test_no_leading_underscore_name_is_imported_across_modules(module):
    for source, name in imports(module):
        private_module = source == "" and name in {f"_{m.lstrip('_')}" for m in MODULES}
        assert not name.startswith("_") or private_module, f"{module} imports {name} from .{source}"

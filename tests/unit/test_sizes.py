"""The sizes the package keeps to: no module over 500 lines, no class over 330, and
the node kinds over the shared virtual layer as small as the layer lets them be."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "celery_redlock"
MODULES = sorted(PACKAGE.rglob("*.py"))

#: A kind's own code (its folder, every module in it) at most this many lines.
KIND_LINES = {"memory": 300, "etcd": 700, "zookeeper": 400}


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_the_package_is_found():
    assert len(MODULES) > 100


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_over_500_lines(path: Path):
    assert lines(path) <= 500


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_class_over_330_lines(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = {
        node.name: node.end_lineno - node.lineno + 1  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 330  # type: ignore[operator]
    }
    assert not long


@pytest.mark.parametrize("kind", sorted(KIND_LINES))
def test_a_kind_over_the_virtual_layer_stays_small(kind: str):
    folder = PACKAGE / "core" / "nodes" / kind
    total = sum(lines(path) for path in folder.glob("*.py"))
    assert 0 < total <= KIND_LINES[kind], total

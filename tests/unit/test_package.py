"""The public surface: exported names, settings documented, the core free of Celery code."""

import ast
from pathlib import Path

import celery_redlock
from celery_redlock import conf

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_redlock"


def test_all_is_sorted_and_complete():
    assert celery_redlock.__all__ == sorted(celery_redlock.__all__)
    public = {name for name in vars(celery_redlock) if not name.startswith("_")}
    modules = {
        name for name, value in vars(celery_redlock).items() if type(value).__name__ == "module"
    }
    assert public - modules == set(celery_redlock.__all__)


def test_every_setting_is_documented_in_the_readme():
    readme = (ROOT / "README.rst").read_text()
    missing = [s.name for s in conf.SETTINGS + conf.BEAT_SETTINGS if f"``{s.name}``" not in readme]
    assert not missing, f"settings missing from README.rst: {missing}"


def test_every_setting_has_a_task_attribute():
    from celery_redlock.task import LockedTask

    missing = [s.task_attr for s in conf.SETTINGS if not hasattr(LockedTask, s.task_attr)]
    assert not missing


def test_the_core_never_imports_celery():
    for module in ("redlock.py", "_nodes.py", "_scripts.py", "heartbeat.py", "keys.py"):
        tree = ast.parse((PACKAGE / module).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n == "celery" or n.startswith("celery.") for n in names), (module, names)

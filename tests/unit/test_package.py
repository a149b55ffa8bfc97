"""The public surface and the layering: exported names, settings documented,
a core free of Celery, no import cycle, redis-py internals in one module."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import celery_redlock
from celery_redlock import conf, settings
from tests.support.refuse import REFUSE_CELERY

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "celery_redlock"

#: Modules outside the core package that must import neither celery nor kombu, even
#: transitively (``exceptions``, ``redlock`` and ``settings`` keep the core's names at their
#: old paths; ``testing`` serves the core's own tests).
CELERY_FREE = (
    "exceptions",
    "metrics",
    "redlock",
    "settings",
    "testing",
    "testing.nodes",
    "testing.plugin",
    "tracing",
)


def run_without_celery(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter that refuses celery and kombu; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", REFUSE_CELERY + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    return done


# -- exported names ------------------------------------------------------------


def test_all_is_sorted_and_complete():
    assert celery_redlock.__all__ == sorted(celery_redlock.__all__)
    for name in celery_redlock.__all__:
        assert getattr(celery_redlock, name) is not None
    public = {name for name in dir(celery_redlock) if not name.startswith("_")}
    modules = {
        name for name, value in vars(celery_redlock).items() if type(value).__name__ == "module"
    }
    assert public - modules == set(celery_redlock.__all__)
    with pytest.raises(AttributeError):
        celery_redlock.NoSuchName  # noqa: B018


def test_improperly_configured_is_both_errors():
    from celery.exceptions import ImproperlyConfigured as CeleryImproperlyConfigured

    error = celery_redlock.ImproperlyConfigured("bad")
    assert isinstance(error, celery_redlock.ConfigurationError)
    assert isinstance(error, CeleryImproperlyConfigured)
    assert isinstance(error, celery_redlock.RedlockError)
    assert isinstance(error, ValueError)
    assert celery_redlock.ImproperlyConfigured is conf.ImproperlyConfigured


def test_every_setting_is_documented_in_the_manual():
    reference = (ROOT / "docs" / "settings.rst").read_text()
    declared = conf.SETTINGS + conf.BEAT_SETTINGS + conf.WORKER_SETTINGS
    missing = [s.name for s in declared if f"``{s.name}``" not in reference]
    assert not missing, f"settings missing from docs/settings.rst: {missing}"
    options = [s.task_attr for s in conf.SETTINGS] + list(settings.TASK_OPTIONS)
    missing = [name for name in options if f"``{name}``" not in reference]
    assert not missing, f"task options missing from docs/settings.rst: {missing}"


def test_every_command_is_documented_in_the_cli_page():
    from celery_redlock.cli import redlock

    page = (ROOT / "docs" / "cli.rst").read_text()
    missing = [c for c in redlock.commands if f"\n``{c}``\n" not in page]
    assert not missing, f"commands missing from docs/cli.rst: {missing}"
    assert {"schema", "web"} <= set(redlock.commands)


def test_every_setting_has_a_task_attribute():
    from celery_redlock.task import LockedTask

    declared = [s.task_attr for s in conf.SETTINGS] + list(settings.TASK_OPTIONS)
    missing = [attr for attr in declared if not hasattr(LockedTask, attr)]
    assert not missing
    undeclared = [a for a in dir(LockedTask) if a.startswith("lock_") and a not in declared]
    assert not undeclared


def test_redlock_defaults_are_the_declared_ones():
    import inspect

    from celery_redlock.redlock import Redlock

    params = inspect.signature(Redlock).parameters
    for name in ("node_timeout", "drift_factor", "key_prefix", "fencing", "fence_retention"):
        assert params[name].default == settings.default("redlock_" + name), name


# -- layering ------------------------------------------------------------------


def _modules() -> dict[str, Path]:
    """Every module of the package by its dotted name inside it (``task``, ``core.lease``);
    a subpackage by its own name (``core``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            found[".".join(parts)] = path
    return found


CORE = tuple(name for name in _modules() if name == "core" or name.startswith("core."))


def _imports(module: str, path: Path) -> set[str]:
    """Every module this one imports, anywhere in it (functions too), as absolute names.

    ``from .x import a`` counts ``x`` and, if it is a module, ``x.a``."""
    package = ["celery_redlock", *module.split(".")]
    if path.name != "__init__.py":
        package.pop()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the module's package
                base = ".".join(package[: len(package) - node.level + 1])
                if node.module is None:  # from . import a, b
                    found.update(f"{base}.{alias.name}" for alias in node.names)
                    continue
                base += f".{node.module}"
            else:
                base = node.module or ""
            found.add(base)
            if base.startswith("celery_redlock"):
                found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _package_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = _imports(name, path)
        inside = (dep.partition(".")[2] for dep in deps if dep.startswith("celery_redlock."))
        graph[name] = {dep for dep in inside if dep in modules} - {name}
    return graph


def test_the_import_walk_sees_relative_and_function_imports():
    graph = _package_graph()
    assert "plan" in graph["task"] and "signals" in graph["task"]
    assert "core.heartbeat" in graph["task"] and "core" in graph["task"]
    assert "core.ops" in graph["core.lease"] and "core.settings" in graph["core.values"]
    assert (
        "core.nodes" in graph["core.quorum"]
        and "core.nodes.redis.rounds" in graph["core.nodes.redis"]
    )
    assert "core.nodes.redis.wire" in graph["core.nodes.redis.rounds"]
    assert "core.nodes.scripts.shared" in graph["core.nodes.scripts.lease"]
    assert "conf" in graph["keys"]
    assert "cli.status" in graph["cli"] and "cli.base" in graph["cli.status"]
    assert "slot_claims" in graph["beat"] and "testing.nodes" in graph["testing.plugin"]


def test_no_import_cycle_among_the_package_modules():
    graph = _package_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep) :] + [dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_the_core_imports_only_the_core():
    graph = _package_graph()
    assert "core.lease" in CORE and "core.nodes.scripts.shared" in CORE
    for module in CORE:
        outside = graph[module] - set(CORE)
        assert not outside, f"core module {module} imports {sorted(outside)}"
        third_party = {dep.split(".")[0] for dep in _imports(module, _modules()[module])} & {
            "celery",
            "kombu",
            "billiard",
        }
        assert not third_party, (module, third_party)


@pytest.fixture(scope="module")
def loads_without_celery() -> dict[str, str]:
    """Module -> what went wrong importing it ("" if nothing), each in its own fork of one
    interpreter that refuses celery and kombu and has loaded nothing of the package (only
    redis-py, which every module needs, so that each fork costs its own imports alone)."""
    names = [f"celery_redlock.{m}" if m else "celery_redlock" for m in CORE + CELERY_FREE + ("",)]
    done = run_without_celery(
        """
        import importlib, os, sys
        import redis  # noqa: F401

        for name in sys.argv[1:]:
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read)
                try:
                    importlib.import_module(name)
                    found = sorted(m for m in sys.modules if m.split(".")[0] in ("celery", "kombu"))
                    error = f"loaded {found}" if found else ""
                except BaseException as exc:
                    error = repr(exc)
                os.write(write, error.encode() or b"-")
                os._exit(0)
            os.close(write)
            with os.fdopen(read, "rb") as pipe:
                said = pipe.read().decode()
            os.waitpid(pid, 0)
            print(name, "" if said == "-" else said or "the fork died", sep="\t")
        """,
        *names,
    )
    out = dict(line.split("\t", 1) for line in done.stdout.splitlines())
    assert set(out) == set(names), done.stdout
    return out


@pytest.mark.parametrize("module", CORE + CELERY_FREE + ("",))
def test_the_core_loads_where_celery_cannot(module, loads_without_celery):
    """Each module of the core, the Celery-free modules beside it, and the package itself,
    import in a fresh interpreter (a fork of one) that refuses celery and kombu."""
    name = f"celery_redlock.{module}" if module else "celery_redlock"
    assert loads_without_celery[name] == ""


CORE_TESTS = sorted((ROOT / "tests" / "core").rglob("*.py"))


def test_the_core_tests_load_where_celery_cannot():
    """The core's tests (``tests/core``), their conftest and the support modules they
    use import in a fresh interpreter that refuses celery and kombu."""
    assert len(CORE_TESTS) >= 10 and any(p.name == "conftest.py" for p in CORE_TESTS)
    run_without_celery(
        """
        import importlib.util, sys
        for index, path in enumerate(sys.argv[1:]):
            spec = importlib.util.spec_from_file_location(f"core_test_{index}", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("celery", "kombu"))
        assert not loaded, loaded
        """,
        *map(str, CORE_TESTS),
    )


def test_the_celery_layer_needs_celery():
    """The refusing finder really refuses: the Celery layer fails to load under it."""
    done = subprocess.run(
        [sys.executable, "-c", REFUSE_CELERY + "import celery_redlock\ncelery_redlock.LockedTask"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode != 0
    assert "refused" in done.stderr


def test_the_core_above_the_seam_imports_no_kind_of_node():
    """Above ``core.nodes``, the core names operations and reads replies: no module
    imports a kind's subpackage or its client library (a new kind is a folder)."""
    modules = _modules()
    graph = _package_graph()
    for name, deps in graph.items():
        if not name.startswith("core") or name.startswith("core.nodes"):
            continue
        # the seam's own modules (the protocol, the codec, the async rounds, the
        # breaker and fork guard) are no kind
        seam = {"core.nodes.kind", "core.nodes.codec", "core.nodes.aio", "core.nodes.guard"}
        kinds = sorted(dep for dep in deps if dep.startswith("core.nodes.") and dep not in seam)
        clients = {d.split(".")[0] for d in _imports(name, modules[name])} & {"redis", "psycopg"}
        assert not kinds and not clients, (name, kinds, clients)


def test_the_primitives_name_operations_not_scripts():
    """Above ``core.nodes`` the core builds operation values (``core.ops``) and reads
    results' fields: no module but the scripts themselves imports them (their KEYS,
    ARGV and reply slots are the codec's, under the seam)."""
    graph = _package_graph()
    for name, deps in graph.items():
        if not name.startswith("core") or name.startswith("core.nodes"):
            continue
        assert not {d for d in deps if d.startswith("core.nodes.scripts")}, name


def test_redis_internals_live_in_one_module():
    """redis-py's private names (``redis._parsers``, ``conn._sock``...) only in the wire
    module (``core.nodes.redis.wire``)."""
    private = ("_parsers", "_sock", "_host_error", "_buffer", "_reader")
    for name, path in _modules().items():
        if name == "core.nodes.redis.wire":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("redis."):
                assert not any(p.startswith("_") for p in node.module.split(".")), (
                    name,
                    node.module,
                )
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("redis."):
                        assert "._" not in alias.name, (name, alias.name)
            if isinstance(node, ast.Attribute) and node.attr in private:
                pytest.fail(f"{name}.py line {node.lineno} uses .{node.attr}")

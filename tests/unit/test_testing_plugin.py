"""``celery_redlock.testing`` is a pytest plugin of every session once the package is
installed: a session that uses none of its fixtures must not feel it."""

from __future__ import annotations

import pytest

INNER = """
import atexit
import os

import celery_redlock.testing as testing
import celery_redlock.testing.nodes as testing_nodes


def children():
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    text = f.read()
            except OSError:
                continue
            if int(text[text.rindex(")") + 2 :].split()[1]) == os.getpid():
                found.append(int(name))
    return found


def test_nothing_of_the_plugin_is_felt(pytestconfig):
    loaded = pytestconfig.pluginmanager.get_plugin("celery_redlock")
    assert loaded in (None, testing)
    assert [name for name in vars(testing) if name.startswith("pytest_")] == []
    assert not pytestconfig.pluginmanager.has_plugin("celery-redlock-nodes")
    assert testing_nodes._armed is False  # no atexit, no at-fork handler registered
    assert not testing_nodes._live
    assert children() == []  # no server started
    print(f"PLUGIN={loaded is not None} ATEXIT={atexit._ncallbacks()} ")
"""


def _run(pytester: pytest.Pytester, *args: str) -> tuple[bool, int]:
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", *args)
    result.assert_outcomes(passed=1)
    [line] = [line for line in result.outlines if "PLUGIN=" in line]
    plugin, atexit_count = line[line.index("PLUGIN=") :].split()[:2]
    return plugin == "PLUGIN=True", int(atexit_count.split("=")[1])


def test_a_session_without_the_fixtures_gets_no_hook_handler_or_process(pytester):
    loaded, with_plugin = _run(pytester)
    assert loaded  # the entry point did load the module
    unloaded, without_plugin = _run(pytester, "-p", "no:celery_redlock")
    assert not unloaded
    assert with_plugin == without_plugin  # not one atexit handler more


def test_free_port_never_hands_out_a_port_twice_in_a_row_of_calls():
    """Servers started together (an etcd cluster's members) each ask for ports before
    any binds: the kernel gives a port just closed to the next ``bind(0)`` as soon as
    to any other, so 300 asks saw 1-3 repeats before the ports handed were kept."""
    from celery_redlock.testing import free_port

    ports = [free_port() for _ in range(1000)]
    assert len(set(ports)) == len(ports)

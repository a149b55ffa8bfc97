"""conf.provenance: each setting's value and its source, with resolve()'s precedence."""

from __future__ import annotations

from celery import Celery

from celery_redlock import conf


class Task:
    lock_ttl = 30.0
    lock_fencing = None  # None: not set, app.conf or the default decides


def sources(rows: list[conf.Provenance]) -> dict[str, tuple]:
    return {row.name: (row.value, row.source) for row in rows}


def test_task_attribute_then_app_conf_then_default():
    app = Celery("prov", set_as_current=False)
    app.conf.redlock_ttl = 20.0
    app.conf.redlock_fencing = False
    rows = conf.provenance(app, Task())
    assert [row.name for row in rows] == [s.name for s in conf.SETTINGS]
    got = sources(rows)
    assert got["redlock_ttl"] == (30.0, "task.lock_ttl")
    assert got["redlock_fencing"] == (False, "app.conf")
    assert got["redlock_drift_factor"] == (0.01, "default")
    assert sources(conf.provenance(app))["redlock_ttl"] == (20.0, "app.conf")


def test_resolved_values_name_what_resolve_filled_in():
    app = Celery("prov", broker="redis://h:1/0", set_as_current=False)
    settings = conf.resolve(app, {"lock_ttl": 30.0})
    got = sources(conf.provenance(app, Task(), settings))
    assert got["redlock_nodes"] == (("redis://h:1/0",), "broker_url")
    assert got["redlock_heartbeat_interval"] == (10.0, "ttl / 3")
    assert got["redlock_ttl"] == (30.0, "task.lock_ttl")

"""Rate values: parsing, and the checks a task's rate options get at bind."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.conf import ImproperlyConfigured
from celery_redlock.core import Window, parse_rate
from celery_redlock.plan import plan_of


@pytest.mark.parametrize(
    ("value", "windows"),
    [
        ("10/s", (Window(10, 1.0),)),
        ("100/m", (Window(100, 60.0),)),
        ("1000/h", (Window(1000, 3600.0),)),
        ("20/10s", (Window(20, 10.0),)),
        (5, (Window(5, 1.0),)),
        ("5", (Window(5, 1.0),)),
        ((10, 60), (Window(10, 60.0),)),
        (("500/h", "10/s"), (Window(10, 1.0), Window(500, 3600.0))),
        ([(3, 2.5), "1/s"], (Window(1, 1.0), Window(3, 2.5))),
    ],
)
def test_parse(value, windows):
    assert parse_rate(value) == windows


@pytest.mark.parametrize("value", ["10/x", "0/s", "-1/s", 2.5, (), "ten", (1, 0), "2000/s"])
def test_parse_rejects(value):
    with pytest.raises(ValueError):
        parse_rate(value)


def _app() -> Celery:
    app = Celery("rates-unit", set_as_current=False)
    app.conf.redlock_nodes = ["redis://127.0.0.1:1/0"]
    return app


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"lock_rate": "ten per second"}, "lock_rate"),
        ({"lock_rate": "1/s", "lock_rate_burst": 0}, "lock_rate_burst"),
        ({"lock_rat": "1/s"}, "did you mean 'lock_rate'"),
        ({"lock_also": {"api": "fast"}}, "lock_also rate of 'api'"),
    ],
)
def test_bind_checks_the_rate_options(options, error):
    app = _app()

    def rated(x): ...

    app.task(base=LockedTask, shared=False, name="rated", **options)(rated)
    with pytest.raises(ImproperlyConfigured, match=error):
        app.finalize()


def test_also_takes_rates_and_limits_apart():
    app = _app()

    @app.task(base=LockedTask, shared=False, lock_also={"api": "100/s", "pool": 3})
    def both(x): ...

    app.finalize()
    plan = plan_of(both)
    assert [limit for _, limit in plan.also] == [3]
    assert [windows for _, windows in plan.also_rates] == [(Window(100, 1.0),)]

    @app.task(base=LockedTask, shared=False, lock_rate=lambda x: "1/s" if x else None)
    def tiered(x): ...

    assert callable(plan_of(tiered).settings.rate)


def test_a_rate_callable_may_take_an_argument_named_rate():
    """The callable gets the task's arguments as they are, a ``rate`` among them."""
    from celery_redlock.core import resolve_rate

    def tier(key, rate="1/s"):
        return rate

    assert resolve_rate(tier, "k", rate="10/s") == (Window(10, 1.0),)

"""``lock_on_duplicate="queue"`` and ``lock_queue_max`` are checked at bind: a
combination that cannot work fails there, naming the option."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_redlock import ImproperlyConfigured, LockedTask, plan_of

NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]


def bind(**options) -> object:
    app = Celery("queue-options", set_as_current=False)
    app.conf.redlock_nodes = NODES

    @app.task(base=LockedTask, shared=False, **options)
    def work(key):
        pass

    app.finalize()
    return work


def test_a_queue_binds_with_its_bound():
    plan = plan_of(bind(lock_on_duplicate="queue", lock_queue_max=5, lock_limit=2))
    assert plan.settings.on_duplicate == "queue" and plan.settings.queue_max == 5


def test_lock_queue_max_without_a_queue_fails_naming_it():
    with pytest.raises(ImproperlyConfigured, match="lock_queue_max = 5 .* lock_on_duplicate"):
        bind(lock_on_duplicate="retry", lock_queue_max=5)


@pytest.mark.parametrize(
    "option, value",
    [("lock_enqueue", "until_started"), ("lock_debounce", 1.0), ("lock_throttle", 1.0)],
)
def test_a_queue_with_a_coalescing_option_fails_naming_it(option, value):
    with pytest.raises(ImproperlyConfigured, match=f"unset {option}"):
        bind(lock_on_duplicate="queue", **{option: value})


@pytest.mark.parametrize("value", [-1, 1.5, "five", True])
def test_a_bad_lock_queue_max_fails_naming_it(value):
    with pytest.raises(ImproperlyConfigured, match="lock_queue_max"):
        bind(lock_on_duplicate="queue", lock_queue_max=value)


def test_a_misspelt_policy_names_queue_among_the_choices():
    with pytest.raises(ImproperlyConfigured, match="queue"):
        bind(lock_on_duplicate="queued")


def test_supersede_binds_and_replaces_one_holder_only():
    assert plan_of(bind(lock_on_duplicate="supersede")).superseding
    with pytest.raises(ImproperlyConfigured, match="lock_limit = 2"):
        bind(lock_on_duplicate="supersede", lock_limit=2)
    with pytest.raises(ImproperlyConfigured, match="lock_queue_max"):
        bind(lock_on_duplicate="supersede", lock_queue_max=3)
    with pytest.raises(ImproperlyConfigured, match="unset lock_debounce"):
        bind(lock_on_duplicate="supersede", lock_debounce=1.0)

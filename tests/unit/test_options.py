"""Lock options and settings are checked at bind: a misspelt name fails, naming the intended one.

Binding builds the Redlock client but connects to nothing, so no server is needed.
"""

from __future__ import annotations

import pytest
from celery import Celery
from celery.exceptions import ImproperlyConfigured as CeleryImproperlyConfigured

from celery_redlock import ConfigurationError, ImproperlyConfigured, LockedTask, plan_of
from celery_redlock.settings import SETTINGS, TASK_OPTIONS, closest

NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]


def make_app(**conf) -> Celery:
    app = Celery("options", set_as_current=False)
    app.conf.update({"redlock_nodes": NODES, **conf})
    return app


def test_a_misspelt_task_keyword_fails_at_bind_naming_the_option():
    app = make_app()
    ran = []

    @app.task(base=LockedTask, shared=False, lock_on_duplicat="retry")
    def work(key="k"):
        ran.append(key)

    with pytest.raises(ImproperlyConfigured) as info:
        app.finalize()
    message = str(info.value)
    assert "'lock_on_duplicat'" in message and "did you mean 'lock_on_duplicate'?" in message
    assert isinstance(info.value, ConfigurationError)
    assert isinstance(info.value, CeleryImproperlyConfigured)
    assert ran == []


def test_a_misspelt_class_attribute_fails_at_bind():
    app = make_app()

    class Settle(LockedTask):
        lock_tll = 30

        def run(self, account):
            pass

    with pytest.raises(ImproperlyConfigured, match="did you mean 'lock_ttl'"):
        app.register_task(Settle())


def test_a_misspelt_task_only_option_fails_too():
    app = make_app()

    @app.task(base=LockedTask, shared=False, lock_tokn_arg="token")
    def work(key, token=None):
        pass

    with pytest.raises(ImproperlyConfigured, match="did you mean 'lock_token_arg'"):
        work.name  # noqa: B018 - evaluates the lazy task, which binds it


def test_an_unrelated_name_gets_no_guess():
    app = make_app()

    @app.task(base=LockedTask, shared=False, lock_zzzzzzzzzzzzz=1)
    def work(key):
        pass

    with pytest.raises(ImproperlyConfigured) as info:
        app.finalize()
    assert "'lock_zzzzzzzzzzzzz'" in str(info.value) and "did you mean" not in str(info.value)


def test_a_misspelt_app_setting_fails_at_bind_naming_the_setting():
    app = make_app(redlock_on_duplicat="retry")

    @app.task(base=LockedTask, shared=False)
    def work(key):
        pass

    with pytest.raises(CeleryImproperlyConfigured) as info:
        app.finalize()
    message = str(info.value)
    assert "'redlock_on_duplicat'" in message
    assert "did you mean 'redlock_on_duplicate'?" in message
    assert isinstance(info.value, ConfigurationError)


def test_a_misspelt_django_style_setting_is_named_as_spelt():
    class Settings:
        CELERY_REDLOCK_NODES = ",".join(NODES)
        CELERY_REDLOCK_TLL = 30

    app = Celery("django-style", set_as_current=False)
    app.config_from_object(Settings, namespace="CELERY")

    @app.task(base=LockedTask, shared=False)
    def work(key):
        pass

    with pytest.raises(ImproperlyConfigured, match="did you mean 'CELERY_REDLOCK_TTL'"):
        app.finalize()


def test_every_declared_option_binds():
    app = make_app(**{s.name: s.default for s in SETTINGS if s.default is not None})
    options = {s.task_attr: s.default for s in SETTINGS if s.default is not None}

    @app.task(
        base=LockedTask,
        shared=False,
        lock_on=("key",),
        lock_name="n",
        lock_also={"api": 4},
        **options,
    )
    def work(key, fencing_token=None):
        pass

    app.finalize()
    plan = plan_of(work)
    assert plan is not None and plan.lock_name == "n" and plan.token_arg == "fencing_token"
    assert set(TASK_OPTIONS) == {"lock_on", "lock_name", "lock_token_arg", "lock_also"}


def test_lock_also_names_the_key_of_a_named_limit_task():
    app = make_app()

    @app.task(base=LockedTask, shared=False, lock_also=("zeta", "alpha"))
    def both(key):
        pass

    @app.task(base=LockedTask, shared=False, lock_name="alpha", lock_on=(), lock_limit=3)
    def named(key, other=None):
        pass

    app.finalize()
    alpha = plan_of(named).keys.build((1,), {"other": 2})
    assert plan_of(named).settings.limit == 3
    assert [name for name, _ in plan_of(both).also] == sorted(
        [alpha, alpha.replace("alpha", "zeta")]
    )
    assert [limit for _, limit in plan_of(both).also] == [1, 1]


@pytest.mark.parametrize(
    "options, match",
    [
        ({"lock_limit": 0}, "lock_limit"),
        ({"lock_limit": 1.5}, "lock_limit"),
        ({"lock_also": {"api": 0}}, "lock_also limit"),
        ({"lock_also": ("work",), "lock_name": "work"}, "other than the task's own"),
        ({"lock_also": ("bad{",)}, "lock name"),
        ({"lock_limt": 2}, "did you mean 'lock_limit'"),
    ],
)
def test_bad_permit_options_fail_at_bind(options, match):
    app = make_app()

    @app.task(base=LockedTask, shared=False, **options)
    def work(key):
        pass

    with pytest.raises(ImproperlyConfigured, match=match):
        app.finalize()


def test_plan_of_is_none_for_other_tasks():
    app = make_app()

    @app.task(shared=False)
    def plain():
        pass

    app.finalize()
    assert plan_of(plain) is None
    assert plan_of(LockedTask) is None  # the abstract base never binds a plan


def test_bad_redlock_arguments_become_improperly_configured_at_bind():
    app = make_app(redlock_nodes=[NODES[0], NODES[0]])

    @app.task(base=LockedTask, shared=False)
    def work(key):
        pass

    with pytest.raises(CeleryImproperlyConfigured, match="listed twice"):
        app.finalize()


def test_closest_needs_a_close_name():
    assert closest("lock_ttl_", ["lock_ttl", "lock_on"]) == "lock_ttl"
    assert closest("nothing_alike", ["lock_ttl"]) is None


def test_an_app_without_lock_nodes_binds_and_fails_at_first_use():
    """A shared task binds to every app of the process, even ones that never run it."""
    app = Celery("no-nodes", set_as_current=False)  # no redlock_nodes, no Redis broker

    @app.task(base=LockedTask, shared=False, lock_ttl=5)
    def work(key="k"):
        return key

    app.finalize()  # binds without a node
    plan = plan_of(app.tasks[work.name])
    assert plan is not None and plan.settings.nodes is None
    with pytest.raises(ImproperlyConfigured, match="set app.conf.redlock_nodes"):
        plan.redlock  # noqa: B018 - the first use names what is missing
    app.conf.redlock_nodes = NODES  # configured after the task bound: found at first use
    later = Celery("later", set_as_current=False)

    @later.task(base=LockedTask, shared=False)
    def other(key="k"):
        return key

    later.finalize()
    later.conf.redlock_nodes = NODES
    assert [n.name for n in plan_of(later.tasks[other.name]).redlock.nodes] == NODES


def test_a_bad_node_url_still_fails_at_bind():
    app = make_app(redlock_nodes=["redis://127.0.0.1:1/0", "redis://127.0.0.1:1/0"])

    @app.task(base=LockedTask, shared=False)
    def work(key="k"):
        return key

    with pytest.raises(ImproperlyConfigured, match="listed twice"):
        app.finalize()

"""Settings that would pass silently: a misspelt prefix, Celery's broker-list
spelling of the nodes, two URLs glued into one; and errors that name a setting
as the configuration spells it (Django's ``CELERY_`` names).

Binding builds the Redlock client but connects to nothing, so no server is needed.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
from celery import Celery
from celery.app.defaults import NAMESPACES, flatten

from celery_redlock import ConfigurationError, ImproperlyConfigured, LockedTask, Redlock, plan_of
from celery_redlock.conf import resolve, resolve_worker
from celery_redlock.settings import SETTINGS, misspelt_prefix

NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]
APP_SETTINGS = [s.name for s in SETTINGS]


def bind(app: Celery, **options) -> LockedTask:
    @app.task(base=LockedTask, shared=False, **options)
    def work(key="k"):
        return key

    app.finalize()
    return work


def plain_app(**conf) -> Celery:
    app = Celery("spelling", set_as_current=False)
    app.conf.update(conf)
    return app


def django_app(**settings) -> Celery:
    """An app configured as a Django project's is: ``config_from_object(settings,
    namespace="CELERY")``, from a settings module with Django's own keys beside."""
    module = types.ModuleType("spelling_settings")
    module.DEBUG = True
    module.DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3"}}
    for name, value in settings.items():
        setattr(module, name, value)
    app = Celery("spelling", set_as_current=False)
    app.config_from_object(module, namespace="CELERY")
    return app


# -- a misspelt prefix -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "key, meant",
    [("redlok_nodes", "redlock_nodes"), ("redis_lock_ttl", "redlock_ttl")],
)
def test_a_misspelt_prefix_fails_at_bind_naming_the_setting(key, meant):
    app = plain_app(redlock_nodes=NODES, **{key: NODES if "nodes" in key else 30})
    with pytest.raises(ImproperlyConfigured) as info:
        bind(app)
    message = str(info.value)
    assert repr(key) in message and f"did you mean {meant!r}?" in message, message


def test_a_misspelt_prefix_under_the_django_namespace_is_named_as_spelt():
    # Without the check, the locks would silently go to the broker's Redis.
    app = django_app(CELERY_BROKER_URL="redis://127.0.0.1:1/0", CELERY_REDLOK_NODES=NODES)
    with pytest.raises(ImproperlyConfigured) as info:
        bind(app)
    message = str(info.value)
    assert "'CELERY_REDLOK_NODES'" in message
    assert "did you mean 'CELERY_REDLOCK_NODES'?" in message, message


def test_no_setting_of_celery_is_taken_for_a_misspelt_prefix():
    celery_keys = [key for key, _ in flatten(NAMESPACES)]
    assert [k for k in celery_keys if misspelt_prefix(k, APP_SETTINGS)] == []


CELERY_REDIS = {
    "redis_backend_use_ssl": None,
    "redis_db": 3,
    "redis_host": "127.0.0.1",
    "redis_max_connections": 10,
    "redis_password": "pw",
    "redis_port": 6380,
    "redis_retry_on_timeout": True,
    "redis_socket_connect_timeout": 2.0,
    "redis_socket_keepalive": True,
    "redis_socket_timeout": 3.0,
    "redis_username": "user",
}
#: Keys of the user's own, near the prefix but not a setting's misspelling.
OTHER_KEYS = {
    "redis_backend_health_check_interval": 5,
    "redis_url": "redis://cache",
    "redis_ttl": 60,
    "lock_ttl": 30,
    "deadlock_timeout": 5,
    "rate_limit": "10/s",
}


def test_celerys_redis_settings_and_other_keys_bind():
    app = plain_app(redlock_nodes=NODES, **CELERY_REDIS, **OTHER_KEYS)
    assert plan_of(bind(app)).settings.nodes == tuple(NODES)


def test_celerys_redis_settings_under_the_django_namespace_bind():
    settings = {f"CELERY_{k.upper()}": v for k, v in {**CELERY_REDIS, **OTHER_KEYS}.items()}
    # Django's own settings (and a project's) outside the namespace are not Celery's.
    app = django_app(CELERY_REDLOCK_NODES=NODES, REDLOK_NODES="x", **settings)
    assert plan_of(bind(app)).settings.nodes == tuple(NODES)


# -- errors name the setting as spelt ---------------------------------------------------------


def test_a_bad_value_from_django_settings_names_the_django_setting():
    app = django_app(CELERY_REDLOCK_NODES=NODES, CELERY_REDLOCK_ON_DUPLICATE="retri")
    with pytest.raises(ImproperlyConfigured) as info:
        bind(app)
    message = str(info.value)
    assert "CELERY_REDLOCK_ON_DUPLICATE = 'retri' must be one of" in message, message
    assert "app.conf" not in message


def test_a_bad_value_set_on_app_conf_names_app_conf():
    app = plain_app(redlock_nodes=NODES, redlock_on_duplicate="retri")
    with pytest.raises(ImproperlyConfigured, match=r"app\.conf\.redlock_on_duplicate = 'retri'"):
        bind(app)


def test_what_to_set_is_named_in_the_django_spelling():
    app = django_app(CELERY_BROKER_URL="amqp://guest@127.0.0.1//")
    with pytest.raises(ImproperlyConfigured, match="set CELERY_REDLOCK_NODES "):
        resolve(app, owner="proj.work")  # the lock nodes, as a task resolves them at first use


def test_a_worker_setting_from_django_settings_names_the_django_setting():
    app = django_app(CELERY_REDLOCK_NODES=NODES, CELERY_REDLOCK_METRICS_PORT=-1)
    with pytest.raises(ImproperlyConfigured, match="CELERY_REDLOCK_METRICS_PORT = -1 must be"):
        resolve_worker(app)


# -- node lists -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "nodes",
    [
        ";".join(NODES),
        "; ".join(NODES) + ";",
        f"{NODES[0]};{NODES[1]},{NODES[2]}",
    ],
)
def test_a_semicolon_separated_node_string_is_a_list_of_nodes(nodes):
    plan = plan_of(bind(plain_app(redlock_nodes=nodes)))
    assert plan.settings.nodes == tuple(NODES)
    assert len(plan.redlock.nodes) == 3 and plan.redlock.quorum == 2


def test_a_semicolon_separated_node_string_from_django_settings():
    plan = plan_of(bind(django_app(CELERY_REDLOCK_NODES=";".join(NODES))))
    assert len(plan.redlock.nodes) == 3


@pytest.mark.parametrize("glued", [";".join(NODES[:2]), ",".join(NODES[:2])])
def test_a_node_url_with_two_schemes_is_refused_at_bind(glued):
    app = plain_app(redlock_nodes=[glued, NODES[2]])
    with pytest.raises(ImproperlyConfigured, match="two 'scheme://'"):
        bind(app)
    app = plain_app(redlock_nodes=NODES)
    with pytest.raises(ImproperlyConfigured, match="two 'scheme://'"):
        bind(app, lock_nodes=[glued])
    with pytest.raises(ConfigurationError, match="holds a second URL"):
        Redlock([glued])


# -- the connect timeout ----------------------------------------------------------------------


def test_the_connect_timeout_reaches_every_node():
    app = plain_app(redlock_nodes=NODES, redlock_connect_timeout=2.5)
    plan = plan_of(bind(app))
    assert plan.settings.connect_timeout == 2.5
    assert [n.connect_timeout for n in plan.redlock.nodes] == [2.5] * 3
    assert [n.pool.connection_kwargs["socket_connect_timeout"] for n in plan.redlock.nodes] == [
        2.5
    ] * 3
    assert [n.pool.connection_kwargs["socket_timeout"] for n in plan.redlock.nodes] == [0.05] * 3
    task_plan = plan_of(bind(plain_app(redlock_nodes=NODES), lock_connect_timeout=0.5))
    assert task_plan.redlock.connect_timeout == 0.5
    with pytest.raises(ImproperlyConfigured, match="lock_connect_timeout = 0 must be a positive"):
        bind(plain_app(redlock_nodes=NODES), lock_connect_timeout=0)


# -- with Django's own settings ---------------------------------------------------------------

DJANGO_PROJECT = """
import django
from django.conf import settings
from celery import Celery
from celery_redlock import ImproperlyConfigured, LockedTask

settings.configure(
    INSTALLED_APPS=[],
    CELERY_BROKER_URL="memory://",
    CELERY_REDLOCK_NODES="redis://127.0.0.1:1/0;redis://127.0.0.1:2/0;redis://127.0.0.1:3/0",
    **{name: value},
)
django.setup()
app = Celery("proj")
app.config_from_object("django.conf:settings", namespace="CELERY")

@app.task(base=LockedTask)
def charge(order_id): ...

try:
    app.finalize()
except ImproperlyConfigured as exc:
    print(exc)
"""


@pytest.mark.parametrize(
    "name, value, said",
    [
        (
            "CELERY_REDLOCK_ON_DUPLICATE",
            "retri",
            "CELERY_REDLOCK_ON_DUPLICATE = 'retri' must be one of",
        ),
        (
            "CELERY_REDLOK_TTL",
            30,
            "'CELERY_REDLOK_TTL' is not a celery_redlock setting (a misspelt prefix); "
            "did you mean 'CELERY_REDLOCK_TTL'?",
        ),
    ],
)
def test_a_django_project_is_told_its_own_setting(name, value, said):
    pytest.importorskip("django")
    script = DJANGO_PROJECT.replace("{name: value}", repr({name: value}))
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert said in done.stdout, done.stdout


def test_a_refused_node_string_keeps_its_passwords_out_of_the_message():
    app = plain_app(redlock_nodes=["redis://:s3cret@a/0;redis://:s3cret@b/0"])
    with pytest.raises(ImproperlyConfigured) as info:
        bind(app)
    assert "s3cret" not in str(info.value) and "two 'scheme://'" in str(info.value)

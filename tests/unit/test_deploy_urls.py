"""Deployment URLs without a server: the sentinel:// grammar, node lists, the broker as default."""

from __future__ import annotations

import ssl

import pytest
from celery import Celery

from celery_redlock.conf import ImproperlyConfigured, nodes_from_app
from celery_redlock.core.nodes.redis import rounds, urls
from celery_redlock.exceptions import ConfigurationError
from celery_redlock.redlock import Redlock
from celery_redlock.settings import by_name


def test_the_sentinel_grammar():
    got = urls.sentinel_options(
        "sentinel://user:p%40ss@h1:26380,h2,[::1]:26381/my%20master/3"
        "?sentinel_password=sp&ssl_ca_certs=/ca.pem&min_other_sentinels=1"
    )
    assert got["sentinels"] == [("h1", 26380), ("h2", 26379), ("::1", 26381)]
    assert got["service"] == "my master"
    assert got["master"] == {
        "username": "user",
        "password": "p@ss",
        "db": 3,
        "ssl": True,  # any ssl_* option turns TLS on, for the master and the sentinels
        "ssl_ca_certs": "/ca.pem",
    }
    assert got["sentinel"] == {"password": "sp", "ssl": True, "ssl_ca_certs": "/ca.pem"}
    assert got["min_other_sentinels"] == 1


def test_the_sentinel_grammar_defaults_and_db_option():
    got = urls.sentinel_options("sentinel://h1/mymaster?db=2")
    assert got["sentinels"] == [("h1", 26379)] and got["master"] == {"db": 2}
    assert got["sentinel"] == {} and got["min_other_sentinels"] == 0
    off = urls.sentinel_options("sentinel://h1/m?ssl=false&ssl_ca_certs=/x")
    assert off["master"] == {} and off["sentinel"] == {}


@pytest.mark.parametrize(
    "url, message",
    [
        ("sentinel://h1:26379", "service"),
        ("sentinel://h1/a/b/c", "service"),
        ("sentinel://h1/m?colour=red", "unknown option 'colour'"),
        ("sentinel://h1:x/m", "port"),
        ("sentinel://h1,/m", "empty"),
        ("sentinel://h1/m?ssl=maybe", "true or false"),
        ("sentinel://h1/m/x", "db"),
    ],
)
def test_a_bad_sentinel_url_is_a_configuration_error_naming_it(url, message):
    with pytest.raises(ConfigurationError, match=message) as info:
        Redlock([url])
    assert "sentinel://h1" in str(info.value)


def test_a_sentinel_node_connects_nowhere_until_used_and_masks_passwords():
    rl = Redlock(["sentinel://:pw@127.0.0.1:1,127.0.0.1:2/m?sentinel_password=sp"])
    (node,) = rl.nodes
    assert node.name == "sentinel://:***@127.0.0.1:1,127.0.0.1:2/m?sentinel_password=***"
    assert not node.lean  # redis-py's Sentinel-managed connections
    assert "pw" not in repr(rl.nodes) and "sp" not in repr(rl.nodes)


def test_a_dead_sentinel_set_fails_fast_naming_the_node(free_port):
    url = f"sentinel://127.0.0.1:{free_port}/m"
    rl = Redlock([url], node_timeout=0.05)
    replies = rounds.gather(rl.nodes, ("PING",), 0.05)
    assert isinstance(replies[0], Exception)


@pytest.mark.parametrize(
    "text, nodes",
    [
        ("redis://a,redis://b", ("redis://a", "redis://b")),
        ("redis://a, redis://b rediss://c", ("redis://a", "redis://b", "rediss://c")),
        ("sentinel://h1:1,h2:2/m,redis://x", ("sentinel://h1:1,h2:2/m", "redis://x")),
        ("sentinel://h1,h2/m sentinel://h3,h4/n", ("sentinel://h1,h2/m", "sentinel://h3,h4/n")),
        ("redis://a,", ("redis://a",)),
    ],
)
def test_a_node_string_splits_between_urls_not_inside_sentinel_urls(text, nodes):
    assert by_name("redlock_nodes").check(text) == nodes


def test_a_celery_sentinel_broker_is_the_default_node():
    app = Celery(broker="sentinel://:pw@10.0.0.1:26379/1;sentinel://10.0.0.2:26380")
    app.conf.broker_transport_options = {
        "master_name": "mymaster",
        "sentinel_kwargs": {"password": "sp"},
        "min_other_sentinels": 1,
    }
    assert nodes_from_app(app) == (
        "sentinel://:pw@10.0.0.1:26379,10.0.0.2:26380/mymaster/1"
        "?sentinel_password=sp&min_other_sentinels=1",
    )
    app.conf.broker_use_ssl = {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/ca.pem"}
    (url,) = nodes_from_app(app)
    got = urls.sentinel_options(url)
    assert got["master"]["ssl"] and got["master"]["ssl_cert_reqs"] == "required"
    assert got["sentinel"]["ssl_ca_certs"] == "/ca.pem" and got["sentinel"]["password"] == "sp"


def test_a_celery_sentinel_broker_without_master_name_says_what_to_set():
    app = Celery(broker="sentinel://10.0.0.1:26379")
    with pytest.raises(ImproperlyConfigured, match="master_name"):
        nodes_from_app(app)


def test_min_replicas_is_checked():
    with pytest.raises(ConfigurationError, match="min_replicas"):
        Redlock(["redis://127.0.0.1:1"], min_replicas=-1)
    assert Redlock(["redis://127.0.0.1:1"], min_replicas=2).nodes[0].min_replicas == 2

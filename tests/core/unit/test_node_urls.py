"""A node URL that names no kind is refused with the URL shown, its password
masked, and the scheme it most likely meant; a SQLAlchemy or Celery spelling of
a PostgreSQL URL is told the libpq spelling to write instead.

Building a node connects to nothing: no server is needed.
"""

from __future__ import annotations

import pytest

from celery_redlock.exceptions import ConfigurationError
from celery_redlock.redlock import Redlock

KNOWN = "redis://, rediss://, unix://, sentinel://"


def refusal(url: str) -> str:
    with pytest.raises(ConfigurationError) as info:
        Redlock([url])
    return str(info.value)


@pytest.mark.parametrize(
    "url, meant",
    [
        ("postgressql://app:s3cret@127.0.0.1:5432/shop", "postgresql://"),
        ("postgre://app@db/shop", "postgres://"),
        ("redsi://:s3cret@127.0.0.1:6379/0", "redis://"),
        ("rediss+clustr://h:7000", "rediss+cluster://"),
        ("etc://127.0.0.1:2379", "etcd://"),
        ("redis+socket:///tmp/redis.sock", "unix://"),
    ],
)
def test_a_scheme_typo_shows_the_url_and_what_it_meant(url, meant):
    said = refusal(url)
    scheme = url.split("://")[0]
    assert f"unknown scheme {scheme}://, did you mean {meant}?" in said
    assert "s3cret" not in said
    shown = url.replace(":s3cret@", ":***@")
    assert repr(shown) in said  # the whole URL, scheme and user kept, not cut at the "@"
    assert KNOWN in said


@pytest.mark.parametrize("url", ["http://127.0.0.1:6379", "amqp://guest:pw@h//", "mysql://u@h/d"])
def test_a_scheme_near_none_gets_no_guess(url):
    said = refusal(url)
    assert "did you mean" not in said and KNOWN in said
    assert url.split("://")[0] + "://" in said


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://app:s3cret@db:5432/shop?sslmode=require",
        "postgresql+psycopg2://app:s3cret@db:5432/shop?sslmode=require",
        "postgres+psycopg://app:s3cret@db:5432/shop?sslmode=require",
        "db+postgresql://app:s3cret@db:5432/shop?sslmode=require",
        "PostgreSQL+Psycopg://app:s3cret@db:5432/shop?sslmode=require",
    ],
)
def test_a_sqlalchemy_or_celery_spelling_is_told_the_libpq_url(url):
    said = refusal(url)
    assert "s3cret" not in said
    scheme = url.split("://")[0]
    assert f"names a driver or a backend ({scheme}://)" in said
    assert "write 'postgresql://app:***@db:5432/shop?sslmode=require'" in said


def test_a_url_without_a_scheme_keeps_its_password_out():
    said = refusal("app:s3cret@db:5432/shop")
    assert "'app:***@db:5432/shop' has no scheme" in said and "s3cret" not in said
    assert "has no scheme" in refusal("localhost:6379")


def test_the_libpq_spellings_are_taken():
    pytest.importorskip("psycopg")
    for url in ("postgresql://app:s3cret@db:5432/shop", "postgres://app@db/shop"):
        client = Redlock([url])
        assert client.nodes[0].kind == "postgres"
        client.close()

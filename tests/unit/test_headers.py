"""Where a claim was written (the ``redlock_claimed_on`` header): compact, password-free."""

from __future__ import annotations

from celery_redlock.core import Redlock
from celery_redlock.headers import where


def test_where_spells_the_prefix_and_nodes_without_passwords():
    redlock = Redlock(
        [
            "redis://:s3cret@b.example:6380/1",
            "redis://user:pw@a.example",
            "unix:///run/r.sock?db=2",
        ],
        key_prefix="shop",
    )
    spelt = where(redlock)
    assert spelt == "shop@/run/r.sock:2,a.example:6379:0,b.example:6380:1"
    assert "s3cret" not in spelt and "pw" not in spelt and "user" not in spelt


def test_one_node_set_is_spelt_one_way():
    three = ["redis://a.example", "redis://b.example:6379/0", "redis://c.example"]
    a = Redlock(three)
    b = Redlock(["redis://c.example:6379", "redis://b.example", "redis://:x@a.example:6379/0"])
    assert where(a) == where(b)  # redis-py's defaults filled in, order and passwords aside
    assert where(a) != where(Redlock(["redis://a.example"]))
    assert where(a) != where(Redlock(three, key_prefix="other"))

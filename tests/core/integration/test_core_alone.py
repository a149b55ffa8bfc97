"""The lock on its own, where celery and kombu cannot be imported: a plain lock library."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.refuse import REFUSE_CELERY

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = REFUSE_CELERY + textwrap.dedent(
    """
    import json

    from celery_redlock import LockContended, Redlock

    rl = Redlock(sys.argv[1:], node_timeout=0.5)
    first = rl.acquire("alone", ttl=5)
    assert first is not None
    assert rl.acquire("alone", ttl=5) is None  # held: a second owner does not get it
    extended = rl.extend(first, ttl=8)
    remaining = first.remaining()
    rl.release(first)
    with rl.lock("alone", ttl=5) as second:
        pass
    try:
        with rl.lock("alone", ttl=5, timeout=0.2):
            with rl.lock("alone", ttl=5, timeout=0.2):
                pass
    except LockContended as exc:
        contended = exc.holder is not None
    print(json.dumps({
        "tokens": [first.fencing_token, second.fencing_token],
        "extended": extended,
        "remaining": remaining,
        "contended": contended,
        "holder": rl.holder("alone").owner,
        "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("celery", "kombu")),
    }))
    """
)


def test_acquire_extend_release_without_celery(redis_nodes3):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *redis_nodes3.urls],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    first, second = seen["tokens"]
    assert isinstance(first, int) and second > first  # fencing tokens grow with every grant
    assert seen["extended"] is True and 5 < seen["remaining"] <= 8
    assert seen["contended"] is True
    assert seen["holder"] is None  # every lock released
    assert seen["loaded"] == []

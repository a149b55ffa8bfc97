"""An async def LockedTask body: refused at bind where its lease could not cover it,
and run inside its lease by an eager call."""

from __future__ import annotations

import sys
import types

import pytest
from celery import Celery

from celery_redlock import ImproperlyConfigured, LockedTask, key_of
from celery_redlock.testing.memory import MemoryNodes


def make_app(nodes: MemoryNodes) -> Celery:
    app = Celery("async-bind", set_as_current=False)
    app.conf.redlock_nodes = nodes.urls
    app.conf.task_always_eager = True
    return app


def test_an_async_body_is_refused_under_a_pool_that_awaits_it_later(monkeypatch):
    monkeypatch.setitem(sys.modules, "celery_aio_pool", types.ModuleType("celery_aio_pool"))
    with MemoryNodes(3) as nodes:
        app = make_app(nodes)
        with pytest.raises(ImproperlyConfigured, match="celery_aio_pool awaits it"):

            @app.task(base=LockedTask, bind=True, name="t.refused", shared=False)
            async def refused(self, x):
                return x

            app.finalize()
            refused.delay(1)


def test_an_eager_async_body_runs_inside_its_lease_with_its_token():
    with MemoryNodes(3) as nodes:
        app = make_app(nodes)
        seen = {}

        @app.task(base=LockedTask, bind=True, name="t.body", shared=False, lock_on=("x",))
        async def body(self, x, fencing_token=None):
            lease = self.request.redlock
            seen.update(name=lease.name, token=fencing_token, lost=lease.lost)
            return fencing_token

        token = body.delay(5).get()
        assert token == seen["token"] and isinstance(token, int)
        assert seen["name"] == key_of(body, 5) and not seen["lost"]

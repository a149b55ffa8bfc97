"""The app ``celery -A beat_app.proj beat`` runs, configured by environment variables.

``CRL_BEAT_BROKER``
    Broker URL (a Redis node of the test).
``CRL_BEAT_NODES``
    Redlock node URLs, separated by commas.
``CRL_BEAT_ENTRIES``
    ``name=spec,...`` where spec is ``every:<seconds>`` (an interval),
    ``aligned:<seconds>`` (due on every multiple of that many epoch seconds, as
    a crontab with second resolution would be), ``cron:<minute field>`` (a
    crontab), optionally followed by ``@<task name>`` (default
    ``beat_app.tick``, a task registered here; any other name is sent with
    ``send_task``).

``CRL_BEAT_NODE_TIMEOUT`` (optional)
    ``redlock_node_timeout`` in seconds.

Every entry's messages carry a ``beat_entry`` header with the entry name.
"""

from __future__ import annotations

import math
import os
from datetime import datetime, timedelta, timezone
from typing import Any

from celery import Celery
from celery.schedules import BaseSchedule, crontab, schedstate, schedule

app = Celery("beat_app")


class aligned(BaseSchedule):
    """Due on every multiple of ``period`` seconds since the epoch, like a crontab.

    Every beat finds it due at the same instant, so they race for each slot.
    Not an interval ``schedule``: the scheduler names its slots by the generic
    rule (``now + remaining_estimate``), so the tests cover that rule too.
    """

    def __init__(self, period: float, **kwargs: Any) -> None:
        self.period = float(period)
        super().__init__(**kwargs)

    def _after(self, dt: datetime) -> float:
        return (math.floor(self.maybe_make_aware(dt).timestamp() / self.period) + 1) * self.period

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        return timedelta(seconds=self._after(last_run_at) - self.now().timestamp())

    def is_due(self, last_run_at: datetime) -> schedstate:
        rem = self.remaining_estimate(last_run_at).total_seconds()
        if rem <= 0:
            return schedstate(True, max(self._after(self.now()) - self.now().timestamp(), 0.01))
        return schedstate(False, rem)

    def __reduce__(self) -> Any:
        return self.__class__, (self.period,)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, aligned) and other.period == self.period

    def __repr__(self) -> str:
        return f"<aligned every {self.period:g}s>"


def _entries(text: str) -> dict:
    entries = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, spec = item.partition("=")
        spec, _, task = spec.partition("@")
        kind, _, arg = spec.partition(":")
        if kind == "every":
            sched: Any = schedule(timedelta(seconds=float(arg)))
        elif kind == "aligned":
            sched = aligned(float(arg))
        elif kind == "cron":
            sched = crontab(minute=arg)
        else:
            raise ValueError(f"CRL_BEAT_ENTRIES: unknown schedule {spec!r}")
        entries[name] = {
            "task": task or "beat_app.tick",
            "schedule": sched,
            "options": {"headers": {"beat_entry": name}},
        }
    return entries


if os.environ.get("CRL_BEAT_NODE_TIMEOUT"):
    app.conf.redlock_node_timeout = float(os.environ["CRL_BEAT_NODE_TIMEOUT"])

app.conf.update(
    broker_url=os.environ.get("CRL_BEAT_BROKER", "redis://127.0.0.1:6379/0"),
    redlock_nodes=os.environ.get("CRL_BEAT_NODES"),
    beat_schedule=_entries(os.environ.get("CRL_BEAT_ENTRIES", "every-1s=every:1")),
    broker_connection_retry_on_startup=True,
    # `celery beat --max-interval` takes whole seconds only; half a second keeps ticks close.
    beat_max_loop_interval=float(os.environ.get("CRL_BEAT_MAX_INTERVAL", "0.5")),
    timezone="UTC",
    # No result backend: without this, beat adds Celery's own daily entry
    # (celery.backend_cleanup, 04:00) and a test running then sees its message.
    result_expires=None,
)


@app.task(name="beat_app.tick")
def tick() -> str:
    return datetime.now(timezone.utc).isoformat()

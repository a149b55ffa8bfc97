"""Beat slots: how every beat names an occurrence, and the mixin's claim / skip / outage logic.

Slot maths runs under freezegun against Celery's own schedules (``is_due`` is
the reference for *when*, the slot for *which*). The mixin runs over fakeredis
nodes (one ``FakeServer`` per node; ``connected = False`` is a dead node) with a
task whose ``apply_async`` records instead of publishing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import fakeredis
import pytest
from celery import Celery, Task
from celery.beat import Scheduler
from celery.result import AsyncResult
from celery.schedules import BaseSchedule, crontab, schedstate, schedule
from freezegun import freeze_time

from celery_redlock import beat as beat_module
from celery_redlock import metrics, slots
from celery_redlock.beat import HEADER, RedlockScheduler, RedlockSchedulerMixin, SlotSkipped
from celery_redlock.exceptions import ConfigurationError
from celery_redlock.slots import Slot, claim_key, compute_slot
from tests.support.celery_headers import BEAT_HEADERS

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def ts(*args: int) -> int:
    return int(utc(*args).timestamp())


@pytest.fixture
def app() -> Celery:
    return Celery("beat-slots", set_as_current=False)


@pytest.fixture
def berlin(app: Celery) -> Celery:
    app.conf.timezone = "Europe/Berlin"
    return app


def test_beat_keeps_exporting_the_slot_names_users_import():
    assert (beat_module.Slot, beat_module.compute_slot, beat_module.claim_key) == (
        slots.Slot,
        slots.compute_slot,
        slots.claim_key,
    )


# -- interval -------------------------------------------------------------------


@freeze_time("2023-11-14 22:13:23.7+00:00")  # epoch 1700000003.7
def test_interval_slot_is_epoch_aligned_whatever_last_run_at(app):
    every5 = schedule(timedelta(seconds=5), app=app)
    starts = [utc(2023, 11, 14, 22, 13, 18, 900000), utc(2023, 11, 14, 22, 0), None]
    slots = {compute_slot(every5, last) for last in starts}
    assert slots == {Slot("interval", "1700000000", 1700000000.0, 1700000005.0)}
    assert compute_slot(every5, None).ttl(60) == 60  # the floor
    assert compute_slot(schedule(timedelta(minutes=15), app=app), None).label == "1699999200"
    assert compute_slot(schedule(timedelta(hours=1), app=app), None).ttl(60) == 7200  # two periods


@freeze_time("2023-11-14 22:13:23.7+00:00")
def test_interval_slot_of_a_fractional_period(app):
    assert compute_slot(schedule(0.5, app=app), None).label == "1700000003.5"
    assert compute_slot(schedule(0.1, app=app), None).label == "1700000003.7"


def test_interval_slots_are_contiguous_and_a_boundary_belongs_to_the_new_slot(app):
    every2 = schedule(2.0, app=app)
    with freeze_time("2023-11-14 22:13:20+00:00") as frozen:  # exactly on a boundary
        labels = []
        for _ in range(6):
            labels.append(int(compute_slot(every2, None).label))
            frozen.tick(2.0)
    assert labels == [1700000000 + 2 * i for i in range(6)]


# -- crontab --------------------------------------------------------------------


@freeze_time("2024-05-06 10:03:10+00:00")
def test_crontab_slot_is_the_scheduled_boundary(app):
    every5 = crontab(minute="*/5", app=app)
    for last in (
        utc(2024, 5, 6, 9, 55, 0, 500000),
        utc(2024, 5, 6, 9, 58, 30),
        utc(2024, 5, 6, 9, 59, 59),
    ):
        assert every5.is_due(last).is_due
        assert compute_slot(every5, last) == Slot(
            "crontab", str(ts(2024, 5, 6, 10, 0)), ts(2024, 5, 6, 10, 0), ts(2024, 5, 6, 10, 5)
        )


@freeze_time("2024-05-06 10:03:10+00:00")
def test_crontab_slot_of_a_beat_that_was_down_is_the_latest_boundary(app):
    # remaining_delta(last_run_at) alone would give 08:05, two hours ago, whose
    # claim has long expired: the catch-up run would duplicate. The latest
    # boundary at or before now is the one the running beats claimed.
    every5 = crontab(minute="*/5", app=app)
    for last in (utc(2024, 5, 6, 8, 1), utc(2024, 5, 4, 8, 1), utc(2023, 5, 6, 8, 1)):
        assert compute_slot(every5, last).label == str(ts(2024, 5, 6, 10, 0))


@freeze_time("2024-05-06 10:03:10+00:00")
def test_crontab_slot_not_yet_due_is_the_upcoming_boundary(app):
    every5 = crontab(minute="*/5", app=app)
    last = utc(2024, 5, 6, 10, 0, 0, 300000)
    assert not every5.is_due(last).is_due
    assert compute_slot(every5, last).label == str(ts(2024, 5, 6, 10, 5))


@freeze_time("2024-05-06 10:03:10+00:00")
def test_crontab_slot_of_a_rare_schedule(app):
    yearly = crontab(minute=0, hour=4, day_of_month=1, month_of_year=3, app=app)
    slot = compute_slot(yearly, utc(2023, 1, 1))
    assert slot.label == str(ts(2024, 3, 1, 4, 0))
    assert slot.next_due == ts(2025, 3, 1, 4, 0)


def run_night(
    sched, start: datetime, end: datetime, step: float = 20.0
) -> list[tuple[float, Slot]]:
    """A beat started at ``start``: (time, slot) of every due tick, as beat would do it."""
    out = []
    with freeze_time(start) as frozen:
        last = start
        now = start
        while now < end:
            frozen.tick(step)
            now += timedelta(seconds=step)
            if sched.is_due(last).is_due:
                out.append((now.timestamp(), compute_slot(sched, last)))
                last = now  # reserve(): last_run_at = now
    return out


def dedupe(*beats: list[tuple[float, Slot]]) -> list[str]:
    """Replay the beats' claims against one store with expiry; the labels sent."""
    claims: dict[str, float] = {}
    sent = []
    for at, slot in sorted((t for beat in beats for t in beat), key=lambda t: t[0]):
        if claims.get(slot.label, -1) > at:
            continue
        claims[slot.label] = at + slot.ttl(60)
        sent.append(slot.label)
    return sent


def test_crontab_spring_forward_the_skipped_0230_is_one_slot(berlin):
    # 2024-03-31: 02:00 CET jumps to 03:00 CEST (01:00 UTC). 02:30 does not exist;
    # Celery runs it at 01:30 UTC (= 03:30 CEST); every beat names it that.
    daily = crontab(hour=2, minute=30, app=berlin)
    with freeze_time("2024-03-31 01:29:59+00:00"):
        assert not daily.is_due(datetime(2024, 3, 30, 2, 30, tzinfo=BERLIN)).is_due
    with freeze_time("2024-03-31 01:30:00.5+00:00"):
        lasts = [
            datetime(2024, 3, 30, 2, 30, 0, 400000, tzinfo=BERLIN),  # ran yesterday
            datetime(2024, 3, 31, 1, 10, tzinfo=BERLIN),  # started before the jump
            datetime(2024, 3, 30, 23, 0, tzinfo=BERLIN),
        ]
        assert all(daily.is_due(last).is_due for last in lasts)
        slots = {compute_slot(daily, last) for last in lasts}
        # Celery does not run it on a beat started after the jump (03:05 CEST):
        # that beat's slot is tomorrow's, so it cannot claim today's by mistake.
        late = datetime(2024, 3, 31, 3, 5, tzinfo=BERLIN)
        assert not daily.is_due(late).is_due
        assert compute_slot(daily, late).label == str(ts(2024, 4, 1, 0, 30))
    assert slots == {
        Slot("crontab", str(ts(2024, 3, 31, 1, 30)), ts(2024, 3, 31, 1, 30), ts(2024, 4, 1, 0, 30))
    }


def test_crontab_spring_forward_quarter_hours_each_once(berlin):
    quarter = crontab(minute="*/15", app=berlin)
    a = run_night(quarter, utc(2024, 3, 30, 23, 50), utc(2024, 3, 31, 2, 10))
    b = run_night(quarter, utc(2024, 3, 31, 0, 55, 10), utc(2024, 3, 31, 2, 10))  # 01:55 CET
    sent = dedupe(a, b)
    # 02:00-02:45 do not exist: 02:00 is 03:00 CEST; UTC quarter hours, each once.
    assert sent == [str(ts(2024, 3, 31, 0, 0) + 900 * i) for i in range(9)]


def test_crontab_fall_back_the_repeated_0230_runs_once(berlin):
    # 2024-10-27: 03:00 CEST falls back to 02:00 CET (01:00 UTC); 02:30 happens twice.
    daily = crontab(hour=2, minute=30, app=berlin)
    first = ts(2024, 10, 27, 0, 30)  # 02:30 CEST
    with freeze_time("2024-10-27 00:30:00.5+00:00"):
        a = compute_slot(daily, datetime(2024, 10, 26, 2, 30, tzinfo=BERLIN))
    # A beat started in the repeated hour (02:05 CET): Celery finds 02:30 due
    # again; its slot is named after the first 02:30, which beat A claimed an
    # hour ago, and the claim is kept long enough to say so.
    with freeze_time("2024-10-27 01:30:01+00:00"):
        started = datetime(2024, 10, 27, 2, 5, fold=1, tzinfo=BERLIN)
        assert daily.is_due(started).is_due
        b = compute_slot(daily, started)
    assert a.label == b.label == str(first)
    assert a.keep == 3600
    assert first + a.ttl(60) > ts(2024, 10, 27, 1, 30, 1)
    assert dedupe([(first, a)], [(ts(2024, 10, 27, 1, 30, 1), b)]) == [str(first)]


def test_crontab_fall_back_quarter_hours_each_wall_time_once(berlin):
    quarter = crontab(minute="*/15", app=berlin)
    a = run_night(quarter, utc(2024, 10, 26, 23, 50), utc(2024, 10, 27, 2, 40))
    b = run_night(quarter, utc(2024, 10, 27, 1, 5), utc(2024, 10, 27, 2, 40))  # 02:05 CET
    sent = dedupe(a, b)
    assert len(sent) == len(set(sent))
    # Every wall-clock quarter hour once: the repeated 02:00-02:45 only at its first pass.
    first_pass = [ts(2024, 10, 27, 0, 0) + 900 * i for i in range(4)]  # 02:00-02:45 CEST
    after = [ts(2024, 10, 27, 2, 0) + 900 * i for i in range(3)]  # 03:00-03:30 CET
    assert sent == [str(t) for t in first_pass + after]


def test_crontab_slot_across_midnight_in_a_utc_app(app):
    hourly_utc = crontab(minute=0, app=app)
    with freeze_time("2024-05-07 00:00:00.2+00:00"):
        slot = compute_slot(hourly_utc, utc(2024, 5, 6, 23, 0, 1))
    assert (slot.label, slot.next_due) == (str(ts(2024, 5, 7, 0, 0)), ts(2024, 5, 7, 1, 0))


# -- solar ----------------------------------------------------------------------


def test_solar_slot_is_the_event_to_the_second_whatever_last_run_at(app):
    from celery.schedules import solar

    sunrise = solar("sunrise", 52.52, 13.40, app=app)
    with freeze_time("2024-06-01 03:30:00+00:00"):  # sunrise in Berlin is 02:49 UTC
        lasts = [utc(2024, 5, 31, 3, 0) + timedelta(minutes=17 * i) for i in range(80)]
        lasts += [utc(2024, 5, 20), utc(2024, 1, 1)]  # a beat that was down for a while
        assert all(sunrise.is_due(last).is_due for last in lasts[:80])
        slots = {compute_slot(sunrise, last) for last in lasts}
        celery_due = (sunrise.now() + sunrise.remaining_estimate(lasts[0])).timestamp()
    labels = {slot.label for slot in slots}
    assert len(labels) == 1, labels  # ephem's noise is folded away
    (label,) = labels
    assert abs(int(label) - celery_due) < 1.0
    assert datetime.fromtimestamp(int(label), UTC).strftime("%H:%M") == "02:49"
    assert all(s.kind == "solar" and 23 * 3600 < (s.period or 0) < 25 * 3600 for s in slots)


def test_solar_slot_not_yet_due_is_the_upcoming_event(app):
    from celery.schedules import solar

    sunset = solar("sunset", 52.52, 13.40, app=app)
    with freeze_time("2024-06-01 12:00:00+00:00"):
        last = utc(2024, 6, 1, 11, 0)
        assert not sunset.is_due(last).is_due
        slot = compute_slot(sunset, last)
    assert datetime.fromtimestamp(int(slot.label), UTC).strftime("%Y-%m-%d %H") == "2024-06-01 19"


# -- other schedules ------------------------------------------------------------


class At(BaseSchedule):
    """A one-off schedule at a fixed time, like django-celery-beat's ``clocked``."""

    def __init__(self, when: datetime, **kwargs):
        self.when = when
        super().__init__(**kwargs)

    def remaining_estimate(self, last_run_at):
        return self.when - self.now()

    def is_due(self, last_run_at):
        return schedstate(self.remaining_estimate(last_run_at).total_seconds() <= 0, 60.0)


@freeze_time("2024-05-06 10:03:10.4+00:00")
def test_other_schedules_use_their_due_time_to_the_second(app):
    at = At(utc(2024, 5, 6, 10, 0, 0), app=app)
    slot = compute_slot(at, utc(2024, 5, 1))
    assert slot == Slot(
        "other", str(ts(2024, 5, 6, 10, 0)), ts(2024, 5, 6, 10, 0), ts(2024, 5, 6, 10, 0)
    )
    assert slot.period is None and slot.ttl(60) == 60
    assert slot.still_due(ts(2024, 5, 6, 10, 0, 59), 60) and not slot.still_due(
        ts(2024, 5, 6, 10, 1), 60
    )


def test_claim_key_and_slot_helpers():
    assert claim_key("nightly report", "1700000000") == "beat:nightly report:1700000000"
    slot = Slot("interval", "100", 100.0, 110.0)
    assert slot.period == 10 and slot.ttl(5) == 20 and slot.ttl(60) == 60
    assert slot.still_due(109.9, 60) and not slot.still_due(110.0, 60)


# -- the mixin over fakeredis nodes -----------------------------------------------


class Recording(Task):
    """Records what beat publishes instead of sending it."""

    sent: list

    def apply_async(self, args=None, kwargs=None, **options):
        self.sent.append((self.name, options))
        return AsyncResult(options["task_id"], app=self.app)


class MemoryScheduler(RedlockSchedulerMixin, Scheduler):
    """The mixin over the in-memory base scheduler; send_task records too."""

    def send_task(self, name, args=None, kwargs=None, **options):
        self.app.sent_by_name.append((name, options))
        return AsyncResult(options["task_id"], app=self.app)


@pytest.fixture
def servers() -> list:
    return [fakeredis.FakeServer() for _ in range(3)]


@pytest.fixture
def beat_app(servers) -> Celery:
    app = Celery("beat-mixin", set_as_current=False, broker="memory://")
    app.conf.redlock_nodes = [fakeredis.FakeRedis(server=s) for s in servers]
    app.conf.beat_schedule = {
        "every-10s": {"task": "t.job", "schedule": 10.0, "options": {"headers": {"mine": "kept"}}},
        "elsewhere": {"task": "t.not_here", "schedule": 10.0},
    }
    app.sent_by_name = []
    sent: list = []

    def job() -> None:
        pass

    app.task(base=Recording, name="t.job", shared=False, sent=sent)(job)
    app.sent = sent
    return app


def key_values(servers, pattern="redlock:beat:*") -> list[dict]:
    out = []
    for server in servers:
        client = fakeredis.FakeRedis(server=server, decode_responses=True)
        out.append({k: (client.get(k), client.pttl(k)) for k in client.scan_iter(pattern)})
    return out


def test_winner_publishes_with_its_claim_id_and_the_slot_header(beat_app, servers):
    metrics.reset()
    with freeze_time("2023-11-14 22:13:23+00:00"):
        a, b = MemoryScheduler(app=beat_app), MemoryScheduler(app=beat_app)
        won = a.apply_async(a.schedule["every-10s"])
        lost = b.apply_async(b.schedule["every-10s"])
        claims = key_values(servers)  # fakeredis expires keys by the frozen clock
    assert isinstance(won, AsyncResult)
    ((name, options),) = beat_app.sent
    assert name == "t.job" and options["task_id"] == won.id
    assert options["headers"] == {"mine": "kept", HEADER: "1700000000", **BEAT_HEADERS}
    assert isinstance(lost, SlotSkipped) and not lost and lost.id is None
    assert (lost.reason, lost.slot, lost.holder_task_id) == ("taken", "1700000000", won.id)
    # The claim: on every node, naming the message, host and pid; TTL = the 60 s floor.
    for node in claims:
        ((key, (value, pttl)),) = node.items()
        assert key == "redlock:beat:every-10s:1700000000"
        assert value.split("|")[0] == won.id and value.split("|")[2].isdigit()
        assert 59_000 < pttl <= 60_000
    assert (a.redlock_sent, a.redlock_skipped, b.redlock_sent, b.redlock_skipped) == (1, 0, 0, 1)
    counted = metrics.snapshot()
    assert counted["beat_sent"] == {"every-10s": 1} and counted["beat_skipped"] == {"every-10s": 1}


def test_loser_still_advances_its_schedule(beat_app):
    with freeze_time("2023-11-14 22:13:23+00:00") as frozen:
        a, b = MemoryScheduler(app=beat_app), MemoryScheduler(app=beat_app)
        frozen.tick(1)
        a.apply_async(a.schedule["every-10s"])
        before = b.schedule["every-10s"]
        assert not b.apply_async(before)  # advance=True: reserve() as the base class does
        after = b.schedule["every-10s"]
        now = after.default_now()
    assert after is not before
    assert after.total_run_count == before.total_run_count + 1
    # Moved on to the next cell of the epoch grid: the start of this one is its last run.
    assert after.last_run_at.timestamp() == 1700000000.0  # 22:13:20, the 10 s cell of 22:13:24
    assert after.last_run_at + after.schedule.run_every > now


def test_apply_entry_logs_a_skipped_slot_without_error(beat_app, caplog):
    with freeze_time("2023-11-14 22:13:23+00:00"):
        a, b = MemoryScheduler(app=beat_app), MemoryScheduler(app=beat_app)
        a.apply_entry(a.schedule["every-10s"])
        with caplog.at_level(logging.DEBUG):
            b.apply_entry(b.schedule["every-10s"])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "already sent by" in caplog.text and "(task " in caplog.text


def test_unregistered_task_goes_through_send_task_with_id_and_header(beat_app):
    with freeze_time("2023-11-14 22:13:23+00:00"):
        a = MemoryScheduler(app=beat_app)
        result = a.apply_async(a.schedule["elsewhere"])
    ((name, options),) = beat_app.sent_by_name
    assert name == "t.not_here" and options["task_id"] == result.id
    assert options["headers"][HEADER] == "1700000000"


def test_next_slot_is_sent_again(beat_app):
    with freeze_time("2023-11-14 22:13:23+00:00") as frozen:
        a, b = MemoryScheduler(app=beat_app), MemoryScheduler(app=beat_app)
        assert a.apply_async(a.schedule["every-10s"])
        frozen.tick(10)
        assert b.apply_async(b.schedule["every-10s"])
        assert not a.apply_async(a.schedule["every-10s"])
    assert [o["headers"][HEADER] for _, o in beat_app.sent] == ["1700000000", "1700000010"]


def test_a_tick_that_crosses_a_boundary_sends_the_cell_it_advanced_from(beat_app, caplog):
    """Advanced at 22:13:29.999, published at 22:13:30.001: the slot of the advance
    goes out, then the next one; never the same slot twice from one beat (which
    would skip it naming itself as the sender, and leave the earlier cell unsent)."""
    beat_app.conf.beat_schedule = {"every-10s": beat_app.conf.beat_schedule["every-10s"]}
    with freeze_time("2023-11-14 22:13:29.999+00:00") as frozen:
        a = MemoryScheduler(app=beat_app)
        entry = a.schedule["every-10s"]
        advanced = a.reserve(entry)  # as Celery's tick does, before apply_entry
        frozen.tick(0.002)  # e.g. the first publish opens the broker connection
        a.apply_entry(entry)
        assert advanced.last_run_at.timestamp() == 1700000000.0
        with caplog.at_level(logging.INFO, logger="celery_redlock.beat"):
            for _ in range(3):
                a.tick()
                frozen.tick(10)
    assert [o["headers"][HEADER] for _, o in beat_app.sent] == [
        str(1700000000 + 10 * i) for i in range(4)
    ]
    assert "skipped" not in caplog.text and a.redlock_skipped == 0


def test_a_slow_claim_round_makes_a_lone_beat_skip_no_cell(beat_app, monkeypatch):
    """Each claim takes 3 s of a 10 s period (a hung node): runs stay at the start of
    their cells instead of drifting 3 s a run until one cell is skipped."""
    beat_app.conf.beat_schedule = {"every-10s": beat_app.conf.beat_schedule["every-10s"]}
    with freeze_time("2023-11-14 22:13:23+00:00") as frozen:
        a = MemoryScheduler(app=beat_app)
        claim = a._redlock_claim

        def slow_claim(*args):
            frozen.tick(3)
            return claim(*args)

        monkeypatch.setattr(a, "_redlock_claim", slow_claim)
        for _ in range(60):
            frozen.tick(max(a.tick() or 0.0, 0.001))  # a returned 0 runs again at once
        now = datetime.now(UTC).timestamp()
    labels = [int(o["headers"][HEADER]) for _, o in beat_app.sent]
    assert len(labels) >= 8 and labels[-1] >= now - 20  # ran on to the end
    # the first is due 10 s after the entry was made (22:13:33); then every cell
    assert labels == list(range(1700000010, labels[-1] + 1, 10)), labels


def test_majority_down_holds_the_slot_back_and_sends_it_once_nodes_return(
    beat_app, servers, caplog
):
    beat_app.conf.beat_schedule = {"every-10s": beat_app.conf.beat_schedule["every-10s"]}
    with freeze_time("2023-11-14 22:13:20+00:00") as frozen:
        a = MemoryScheduler(app=beat_app)
        frozen.tick(10.2)  # due: slot 1700000010
        servers[0].connected = servers[1].connected = False
        with caplog.at_level(logging.INFO, logger="celery_redlock.beat"):
            delay = a.tick()
            assert beat_app.sent == [] and a.redlock_outages == 1
            assert 0 <= delay <= 1.0  # wakes up soon to retry
            assert [r.levelname for r in caplog.records if "NOT sent" in r.message] == ["ERROR"]
            held_id = a._redlock_held["every-10s"].task_id
            for _ in range(5):
                a.tick()  # ticks in a row do not hammer the nodes
            assert a.redlock_outages == 1
            frozen.tick(1)
            a.tick()  # still down: retried once more, not sent, not logged again
            assert beat_app.sent == [] and a.redlock_outages == 2
            assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
            servers[0].connected = servers[1].connected = True
            frozen.tick(1)
            a.tick()
            claims = key_values(servers)
    ((_, options),) = beat_app.sent
    assert options["headers"][HEADER] == "1700000010"
    # The retried claim kept the value of the first attempt: same message id.
    assert options["task_id"] == held_id
    assert claims[2]["redlock:beat:every-10s:1700000010"][0].startswith(options["task_id"])
    assert "quorum back" in caplog.text
    assert (a.redlock_sent, a.redlock_missed) == (1, 0)


def test_majority_down_past_the_slot_logs_it_as_missed(beat_app, servers, caplog):
    beat_app.conf.beat_schedule = {"every-10s": beat_app.conf.beat_schedule["every-10s"]}
    with freeze_time("2023-11-14 22:13:20+00:00") as frozen:
        a = MemoryScheduler(app=beat_app)
        frozen.tick(10.2)
        servers[0].connected = servers[1].connected = False
        a.tick()
        frozen.tick(5)
        a.tick()
        servers[0].connected = servers[1].connected = True
        frozen.tick(5)  # 1700000020.2: slot 1700000010 has passed, 1700000020 is due
        with caplog.at_level(logging.ERROR, logger="celery_redlock.beat"):
            a.tick()
            a.tick()
    assert [o["headers"][HEADER] for _, o in beat_app.sent] == ["1700000020"]
    assert a.redlock_missed == 1 and "1700000010" in caplog.text and "was NOT sent" in caplog.text


def test_publish_on_outage_sends_anyway_and_logs_an_error(beat_app, servers, caplog):
    beat_app.conf.redlock_beat_publish_on_outage = True
    servers[0].connected = servers[2].connected = False
    with freeze_time("2023-11-14 22:13:23+00:00"), caplog.at_level(logging.ERROR):
        a = MemoryScheduler(app=beat_app)
        assert a.apply_async(a.schedule["every-10s"])
    assert len(beat_app.sent) == 1 and a.redlock_outages == 1
    assert "WITHOUT a claim" in caplog.text


def test_minority_down_changes_nothing(beat_app, servers):
    servers[1].connected = False
    with freeze_time("2023-11-14 22:13:23+00:00"):
        a, b = MemoryScheduler(app=beat_app), MemoryScheduler(app=beat_app)
        assert a.apply_async(a.schedule["every-10s"])
        assert not b.apply_async(b.schedule["every-10s"])
    assert len(beat_app.sent) == 1 and a.redlock_outages == b.redlock_outages == 0


def test_split_vote_retries_then_holds_the_slot_back(beat_app, servers):
    # Racing beats left different values on two nodes: nobody holds a majority,
    # and with every node answering nobody can.
    key = "redlock:beat:every-10s:1700000000"
    fakeredis.FakeRedis(server=servers[0]).set(key, "x|h|1", px=60_000)
    fakeredis.FakeRedis(server=servers[1]).set(key, "y|h|2", px=60_000)
    with freeze_time("2023-11-14 22:13:23+00:00") as frozen:
        a = MemoryScheduler(app=beat_app)
        pauses: list = []
        a.redlock.sleep = pauses.append
        result = a.apply_async(a.schedule["every-10s"])
        assert not result and result.reason == "split" and len(pauses) == 2
        assert all(0 <= p <= 2 * a.redlock.node_timeout for p in pauses)
        for server in servers[:2]:
            fakeredis.FakeRedis(server=server).delete(key)
        frozen.tick(0.5)
        a.tick()  # not before the retry interval
        assert beat_app.sent == []
        frozen.tick(0.5)
        a.tick()
    assert [o["headers"][HEADER] for _, o in beat_app.sent] == ["1700000000"]


def test_a_winner_seen_on_a_minority_because_its_other_node_is_down_is_a_winner(beat_app, servers):
    # Beat A won on nodes 1 and 2; node 0 then came back empty and node 2 went
    # away. B is granted node 0, refused by node 1: the nodes B can reach show
    # A on one node only, which with the silent node may be a quorum. B reads
    # again once a racing claim would have been withdrawn; A's claim stays.
    key = "redlock:beat:every-10s:1700000000"
    for server in servers[1:]:
        fakeredis.FakeRedis(server=server).set(key, "a-id|host-a|1", px=60_000)
    servers[2].connected = False
    with freeze_time("2023-11-14 22:13:23+00:00"):
        b = MemoryScheduler(app=beat_app)
        pauses: list = []
        b.redlock.sleep = pauses.append
        result = b.apply_async(b.schedule["every-10s"])
        node0 = key_values(servers[:1])
    assert not result and (result.reason, result.holder_task_id) == ("taken", "a-id")
    assert beat_app.sent == [] and b.redlock_outages == 0
    assert node0 == [{}]  # B's grant on node 0 was withdrawn
    assert (
        len(pauses) == 1 and 2 * b.redlock.node_timeout <= pauses[0] <= 3 * b.redlock.node_timeout
    )


def test_a_claim_that_landed_though_its_replies_were_lost_is_ours(beat_app, servers):
    # The nodes stored our value but the replies never came back, and the
    # withdrawal did not reach them: the read-back finds our value on a quorum.
    with freeze_time("2023-11-14 22:13:23+00:00"):
        a = MemoryScheduler(app=beat_app)

        def lost_replies(key, value, *, ttl):
            for server in servers:
                fakeredis.FakeRedis(server=server).set(f"redlock:{key}", value, px=int(ttl * 1000))
            return False

        a.redlock.claim = lost_replies
        result = a.apply_async(a.schedule["every-10s"])
    assert isinstance(result, AsyncResult)
    ((_, options),) = beat_app.sent
    assert options["task_id"] == result.id


def test_misconfiguration_fails_at_scheduler_start_with_the_setting_named(tmp_path):
    app = Celery("bad", set_as_current=False, broker="memory://")
    with pytest.raises(ConfigurationError, match="beat de-duplication.*redlock_nodes"):
        RedlockScheduler(app=app, schedule_filename=str(tmp_path / "s"))
    assert not list(tmp_path.iterdir())  # failed before opening the schedule file
    app.conf.redlock_nodes = [
        "redis://127.0.0.1:1/0",
        "redis://127.0.0.1:2/0",
        "redis://127.0.0.1:3/0",
    ]
    app.conf.redlock_beat_min_ttl = 0
    with pytest.raises(ConfigurationError, match="redlock_beat_min_ttl = 0"):
        RedlockScheduler(app=app, schedule_filename=str(tmp_path / "s"))
    app.conf.redlock_beat_min_ttl = None
    app.conf.redlock_beat_publish_on_outage = "yes"
    with pytest.raises(ConfigurationError, match="redlock_beat_publish_on_outage"):
        RedlockScheduler(app=app, schedule_filename=str(tmp_path / "s"))


def test_lazy_scheduler_banner_shows_nodes_without_passwords_or_the_error(tmp_path):
    app = Celery("banner", set_as_current=False, broker="memory://")
    lazy = RedlockScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True)
    assert "redlock -> NOT CONFIGURED" in lazy.info  # lazy: the banner reports, start fails
    app.conf.redlock_nodes = [f"redis://:s3cret@127.0.0.1:{port}/0" for port in (7001, 7002, 7003)]
    app.conf.redlock_key_prefix = "acme"
    info = RedlockScheduler(app=app, schedule_filename=str(tmp_path / "s"), lazy=True).info
    assert info.startswith(f"    . db -> {tmp_path / 's'}")
    assert "quorum 2 of 3" in info and "redis://:***@127.0.0.1:7002/0" in info
    assert "s3cret" not in info
    assert "acme:beat:<entry>:<slot>" in info and "hold back and retry" in info

"""The example tasks: each shows one feature."""

import json
import os
import time

import redis

from celery_redlock import LockedTask, current_lease

from .app import app


def journal() -> redis.Redis:
    """Where the tasks write what they did (the broker's Redis, another db)."""
    return redis.Redis.from_url(os.environ.get("EXAMPLE_JOURNAL_URL", "redis://127.0.0.1:6379/3"))


def record(kind: str, **fields) -> None:
    journal().rpush("journal", json.dumps({"kind": kind, "pid": os.getpid(), **fields}))


# A fenced resource: the write lands only if its token beats the last one seen.
FENCED_WRITE = """
local f = redis.call('GET', KEYS[2])
if f and (#f > #ARGV[1] or (#f == #ARGV[1] and f >= ARGV[1])) then return 0 end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('INCRBYFLOAT', KEYS[1], ARGV[2])
return 1
"""


@app.task(
    base=LockedTask, bind=True, lock_on=("account_id",), lock_on_duplicate="retry", max_retries=0
)
def settle(self, account_id, amount, fencing_token=None):
    """One settlement per account at a time; duplicates are retried, not dropped."""
    start = time.time()
    time.sleep(0.3)
    accepted = journal().eval(
        FENCED_WRITE, 2, f"balance:{account_id}", f"fence:{account_id}", fencing_token, amount
    )
    record(
        "settle",
        account_id=account_id,
        token=fencing_token,
        start=start,
        end=time.time(),
        accepted=accepted,
    )
    return fencing_token


@app.task(base=LockedTask, lock_on=("order.customer.id",))
def ship(order):
    """Per-argument key through a dotted path; duplicates are dropped (the default)."""
    start = time.time()
    time.sleep(0.5)
    record(
        "ship",
        customer=order["customer"]["id"],
        token=current_lease().fencing_token,
        start=start,
        end=time.time(),
    )


@app.task(base=LockedTask, bind=True, lock_ttl=1.0, lock_on=())
def long_import(self):
    """Runs three times longer than its TTL: the heartbeat keeps the lease."""
    start = time.time()
    time.sleep(3.0)
    record("long_import", start=start, end=time.time(), lost=self.request.redlock.lost)


@app.task(base=LockedTask, lock_name="inventory", lock_on=("sku",))
def reserve(sku):
    """Shares the lock name "inventory" with restock: the two exclude each other per sku."""
    start = time.time()
    time.sleep(0.3)
    record("inventory", task="reserve", sku=sku, start=start, end=time.time())


@app.task(
    base=LockedTask,
    lock_name="inventory",
    lock_on=("sku",),
    lock_on_duplicate="wait",
    lock_wait_timeout=5,
)
def restock(sku, quantity=1):
    start = time.time()
    time.sleep(0.3)
    record("inventory", task="restock", sku=sku, start=start, end=time.time())


@app.task(bind=True)
def tick(self):
    """Sent by two beats every second: each slot arrives once.

    No execution lock: the beats' slot claims alone keep a slot to one message, so a
    slot sent twice would show here as two runs. (A lock would drop a tick that ran
    beside the next one, as two queued behind the other demos' tasks do.)"""
    record(
        "tick",
        slot=self.request.get("redlock_beat_slot")
        or (self.request.headers or {}).get("redlock_beat_slot"),
    )


@app.task(base=LockedTask, lock_on=())
def sync():
    """Sent every second by beat but runs 2.5 s: overlapping slots are dropped, never run twice."""
    start = time.time()
    time.sleep(2.5)
    record("sync", start=start, end=time.time())


@app.task(base=LockedTask, lock_on=())
def report():
    record("report")


@app.task(base=LockedTask, lock_on=("report_id",), lock_enqueue="until_finished")
def rebuild_report(report_id):
    """Claimed at enqueue: while one is queued or running, .delay() returns that one."""
    start = time.time()
    time.sleep(1.0)
    record("rebuild_report", report_id=report_id, start=start, end=time.time())


@app.task(base=LockedTask, lock_on=("index",), lock_debounce=1.0, lock_debounce_max=3.0)
def reindex(index, edit=None):
    """A burst of edits collapses into one run, 1 s after the last, with the newest edit."""
    record("reindex", index=index, edit=edit, start=time.time())


@app.task(base=LockedTask, lock_on=("account",), lock_throttle=1.0)
def webhook(account, event=None):
    """At most one run per account per second; a burst ends with one trailing run."""
    record("webhook", account=account, event=event, start=time.time())


# Both share one API quota, "payment-api" at 10 starts per second across every
# worker, each with its own per-account lock: a rate in lock_also.
PAYMENT_API = {"payment-api": "10/s"}


@app.task(base=LockedTask, lock_on=("account",), lock_also=PAYMENT_API, lock_on_duplicate="retry")
def charge(account, amount):
    """A call to the payment API: over the shared rate it is re-published for its slot."""
    record("payment-api", task="charge", account=account, start=time.time())


@app.task(base=LockedTask, lock_on=("account",), lock_also=PAYMENT_API, lock_on_duplicate="retry")
def refund(account, amount):
    record("payment-api", task="refund", account=account, start=time.time())

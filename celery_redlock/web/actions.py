"""The dashboard's two actions, owner-checked the way ``celery redlock release`` checks.

* release a lock or a permit: the request names the holder the operator
  confirmed. A holder that is a task is released with
  :meth:`Redlock.release_owned_by` (each node deletes the key only if that
  task holds it, as ``release --task-id`` does); any other holder, by
  reading the key again and, if the holder is still the one confirmed,
  :meth:`Redlock.force_release` (as ``release`` after its prompt does).
* withdraw a claim: :meth:`Redlock.withdraw_claim`, which deletes the claim
  only where it still names the confirmed task (``release --claim``).

One key per request; there is no action on many keys.
"""

from __future__ import annotations

from typing import Any

from .._reading import key_report
from ..conf import LockSettings
from ..core import Redlock

__all__ = ["ActionRefused", "release", "withdraw"]


class ActionRefused(Exception):
    """The action was not done: the key changed, or the request does not fit it."""

    def __init__(self, message: str, status: str = "409 Conflict"):
        super().__init__(message)
        self.status = status


def release(
    client: Redlock, settings: LockSettings, name: str, permit: Any, body: dict
) -> dict[str, Any]:
    """Release permit ``permit`` (0: the lock key) of ``name``, held by ``body["owner"]``."""
    owner = str(body["owner"])
    index = int(permit or 0)
    keys = client.permit_keys(name, index + 1)
    key = keys[index]
    fence_key = client.keys(name)[1]
    lock = key_report(client, key, fence_key)
    problem = lock.outage()
    if problem:
        raise ActionRefused(problem + "; nothing released", "503 Service Unavailable")
    if lock.holder.owner != owner or lock.owners - {owner}:
        raise ActionRefused(
            f"not released: {key} is no longer held by the holder you confirmed "
            f"(now: {lock.describe()})"
        )
    task_id = lock.holder.task_id
    total = len(client.nodes)
    if task_id is not None:
        deleted = client.release_owned_by(name, task_id, max(index + 1, settings.limit))
        errors: list[Any] = []
    elif index == 0:
        deletions = client.force_release(name)
        deleted = sum(1 for d in deletions if d.deleted)
        errors = [[d.node, d.error] for d in deletions if d.error is not None]
    else:
        raise ActionRefused(
            "a permit held outside a task is released by its TTL only", "400 Bad Request"
        )
    return {
        "ok": True,
        "key": key,
        "deleted": deleted,
        "nodes_total": total,
        "errors": errors,
        "message": f"Released {key} on {deleted} of {total} nodes (holder {lock.summary()}).",
    }


def withdraw(client: Redlock, name: str, claimant: str) -> dict[str, Any]:
    """Withdraw ``name``'s claim where it names the task ``claimant``."""
    key = client.claim_key(name)
    withdrawn = client.withdraw_claim(name, claimant)
    total = len(client.nodes)
    if not withdrawn:
        raise ActionRefused(f"not withdrawn: {key} is not claimed by task {claimant}")
    return {
        "ok": True,
        "key": key,
        "deleted": withdrawn,
        "nodes_total": total,
        "message": f"Withdrew {key} of task {claimant} on {withdrawn} of {total} nodes.",
    }

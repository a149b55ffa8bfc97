"""A ``sentinel://`` node's master, asked of every sentinel at once."""

from __future__ import annotations

import queue

import redis
import redis.sentinel

from ...connect import connector

__all__ = ["Sentinels"]


class Sentinels(redis.sentinel.Sentinel):
    """redis-py's ``Sentinel``, but every sentinel is asked at once (in threads of
    :func:`connector`), and the first valid answer wins: a hung sentinel costs
    nothing while another answers. redis-py asks one after another, each within
    its timeout, so a hung first sentinel delays every new connection."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        sentinels = list(self.sentinels)
        if len(sentinels) < 2:
            return super().discover_master(service_name)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        for sentinel in sentinels:
            connector().submit(_ask_sentinel, sentinel, answers)
        errors = []
        for _ in sentinels:  # each ask ends within its sentinel's own timeouts
            sentinel, masters, error = answers.get()
            if error is not None:
                errors.append(f"{sentinel} - {error!r}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                return state["ip"], state["port"]
        detail = f" : {', '.join(errors)}" if errors else ""
        raise redis.sentinel.MasterNotFoundError(f"No master found for {service_name!r}{detail}")


def _ask_sentinel(sentinel: redis.Redis, answers: queue.SimpleQueue) -> None:
    try:
        answers.put((sentinel, sentinel.sentinel_masters(), None))
    except Exception as exc:  # whatever it is, the lookup must hear back
        answers.put((sentinel, None, exc))

"""The primitives' logic as steps: no I/O inside, driven by a sync or an async driver.

A primitive (an acquire, a renewal, a release, a lazy token's issue) is a
generator that yields what it needs from the nodes and receives the answer:

* an operation value (:mod:`.ops`): one round on every node; it receives the
  typed results, one per node (an error is a result, never raised);
* :class:`On`: one round on some nodes, within a timeout; the same answer;
* :class:`Pause`: wait that many seconds; it receives None;
* :class:`Unwaited`: write a deletion without waiting for the replies; it
  receives the indexes of the nodes it was not written to (a driver that
  cannot write unwaited answers "all of them", and the step runs a round).

Its return value is the primitive's result. :func:`drive` runs it with the
client's :class:`~.quorum.Quorum` and its sleep, in this thread; the asyncio
client runs the very same steps with its own rounds and ``asyncio.sleep``
(:mod:`celery_redlock.core.aio`). The logic is written once.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, TypeVar

from .ops import Op
from .quorum import Quorum

__all__ = ["On", "Pause", "Steps", "Unwaited", "drive"]

T = TypeVar("T")

#: A primitive's steps, returning its result.
Steps = Generator[Any, Any, T]


class On:
    """A round of ``op`` on ``nodes`` (some of the client's), within ``timeout`` seconds."""

    __slots__ = ("op", "nodes", "timeout")

    def __init__(self, op: Op, nodes: Sequence[Any], timeout: float | None = None):
        self.op, self.nodes, self.timeout = op, nodes, timeout


class Pause:
    """Wait ``seconds`` before the next step."""

    __slots__ = ("seconds",)

    def __init__(self, seconds: float):
        self.seconds = seconds


class Unwaited:
    """Write the deletion ``op`` to every node without waiting for the replies."""

    __slots__ = ("op",)

    def __init__(self, op: Op):
        self.op = op


#: The steps that are not an operation (one look for the usual step, an operation).
_OTHER_STEPS = frozenset({On, Pause, Unwaited})


def drive(q: Quorum, steps: Steps[T]) -> T:
    """Run ``steps`` in this thread: rounds through ``q``, pauses with its sleep."""
    send = steps.send
    run = q.run
    try:
        need = send(None)
        while True:
            kind = type(need)
            if kind not in _OTHER_STEPS:
                need = send(run(need))
            elif kind is Pause:
                q.sleep(need.seconds)
                need = send(None)
            elif kind is On:
                need = send(run(need.op, need.nodes, need.timeout))
            else:
                need = send(q.send(need.op))
    except StopIteration as done:
        return done.value

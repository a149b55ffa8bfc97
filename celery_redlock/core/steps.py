"""The primitives' logic as steps: no I/O inside, driven by a sync or an async driver.

A primitive (an acquire, a renewal, a release, a lazy token's issue) is a
generator that yields what it needs from the nodes and receives the answer:

* an operation value (:mod:`.ops`): one round on every node; it receives the
  typed results, one per node (an error is a result, never raised);
* :class:`On`: one round on some nodes, within a timeout; the same answer;
* :class:`Pause`: wait that many seconds; it receives None;
* :class:`Unwaited`: write a deletion without waiting for the replies; it
  receives the indexes of the nodes it was not written to (a driver that
  cannot write unwaited answers "all of them", and the step runs a round);
* :class:`Carried`: a call of the sync client's own (permits, rated starts:
  rounds not written as steps); it receives the call's result.

Its return value is the primitive's result. :func:`drive` runs it with the
client's :class:`~.quorum.Quorum` and its sleep, in this thread; the asyncio
client runs the very same steps with its own rounds and ``asyncio.sleep``
(:mod:`celery_redlock.core.aio`). The logic is written once, and so is each
call's signature: :func:`driven` makes the sync method of a steps method.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Generator, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar

from .ops import Op
from .quorum import Quorum

__all__ = ["Carried", "On", "Pause", "Steps", "Unwaited", "carried", "dressed", "drive", "driven"]

T = TypeVar("T")
S = TypeVar("S")
C = TypeVar("C", bound=Callable[..., Any])
P = ParamSpec("P")

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


class Carried:
    """A blocking call of the sync client, made where the driver runs blocking calls."""

    __slots__ = ("call",)

    def __init__(self, call: Callable[[], Any]):
        self.call = call


#: The steps that are not an operation (one look for the usual step, an operation).
_OTHER_STEPS = frozenset({On, Pause, Unwaited, Carried})


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
            elif kind is Unwaited:
                need = send(q.send(need.op))
            else:  # Carried
                need = send(need.call())
    except StopIteration as done:
        return done.value


def carried(call: Callable[[], T]) -> Steps[T]:
    """The blocking ``call`` as one step (:class:`Carried`)."""
    return (yield Carried(call))


def dressed(call: C, steps_of: Callable[..., Any], qualname: str) -> C:
    """``call``, the method that drives ``steps_of``'s steps, under ``qualname``
    with their docstring and signature (returning ``X`` where they return ``Steps[X]``)."""
    signature = inspect.signature(steps_of)
    result = signature.return_annotation
    if isinstance(result, str) and result.startswith("Steps[") and result.endswith("]"):
        result = result[len("Steps[") : -1]
    call.__doc__, call.__qualname__ = steps_of.__doc__, qualname
    call.__signature__ = signature.replace(return_annotation=result)  # type: ignore[attr-defined]
    return call


def driven(
    steps_of: Callable[Concatenate[S, P], Steps[T]], quorum: str = "quorum"
) -> Callable[Concatenate[S, P], T]:
    """The sync method of the steps method ``steps_of``: its arguments and docstring,
    its steps driven in this thread with the owner's :class:`~.quorum.Quorum`
    (the attribute ``quorum``)."""
    quorum_of = operator.attrgetter(quorum)

    def call(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return drive(quorum_of(self), steps_of(self, *args, **kwargs))

    return dressed(call, steps_of, f"driven({steps_of.__qualname__})")

"""What the groups of test servers share: a list a test indexes, iterates and
closes, with the fault verbs by index.

A fleet is lock nodes whose ``urls`` make one quorum;
:class:`~celery_redlock.testing.RedisNodes` set its verbs and the fleets of the
other kinds answer to the same ones, so that one test body can drive any kind.
An ensemble (etcd, ZooKeeper) is one lock node of several members.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

M = TypeVar("M")
G = TypeVar("G", bound="Group[Any]")


@contextmanager
def closed_on_error(group: Any) -> Iterator[None]:
    """Close ``group`` (what of it was made) if the block fails, and raise on."""
    try:
        yield
    except BaseException:
        group.close()
        raise


class Group(Generic[M]):
    """``members``, with ``kill(i)``, ``pause(i)`` and ``resume(i)`` on the
    process(es) of member ``i``; closed on leaving a ``with`` block."""

    members: list[M]

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> M:
        return self.members[index]

    def __iter__(self) -> Iterator[M]:
        return iter(self.members)

    def __enter__(self: G) -> G:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def _all(self) -> list[Any]:
        return self.members

    def _processes(self, index: int) -> Iterable[Any]:
        return [self._all()[index]]

    def kill(self, index: int) -> None:
        for process in self._processes(index):
            process.kill()

    def pause(self, index: int) -> None:
        for process in self._processes(index):
            process.pause()

    def resume(self, index: int) -> None:
        for process in self._processes(index):
            process.resume()


def _up(process: Any) -> bool:
    return bool(process.is_running and not process.is_paused)


class Fleet(Group[M]):
    """Lock nodes, each with ``url``, ``keys()``, ``flushall()`` and ``close()``."""

    def _fill(self, n: int, make: Callable[[], M]) -> None:
        """Make ``n`` members; if one fails, close those made and raise."""
        self.members = []
        with closed_on_error(self):
            for _ in range(n):
                self.members.append(make())

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self._all()]

    def _answers(self, node: Any) -> bool:
        return True

    def keys(self, pattern: str = "*") -> dict[int, list[str]]:
        """Each answering lock node's index -> its sorted live keys matching ``pattern``."""
        return {i: n.keys(pattern) for i, n in enumerate(self._all()) if self._answers(n)}

    def flushall(self) -> None:
        for node in self._all():
            if self._answers(node):
                node.flushall()

    def close(self) -> None:
        for node in self._all():
            node.close()


class ServerFleet(Fleet[M]):
    """A fleet whose lock nodes are one process each: ``kill(i)``, ``pause(i)``,
    ``resume(i)``, ``restart(i)`` act on that process, ``heal()`` on them all."""

    def _answers(self, node: Any) -> bool:
        return _up(node)

    def restart(self, index: int) -> None:
        self._all()[index].restart()

    def heal(self) -> None:
        """Resume paused nodes and start stopped ones (their data kept)."""
        for node in self._all():
            node.resume()
            node.start()


class EnsembleFleet(ServerFleet[M]):
    """A fleet of ensembles (etcd, ZooKeeper): the verbs act on every member of
    ensemble ``i``; it answers while one member does."""

    def _processes(self, index: int) -> Iterable[Any]:
        return list(self._all()[index])

    def _answers(self, node: Any) -> bool:
        return any(_up(member) for member in node)

    def restart(self, index: int) -> None:
        self.kill(index)
        self._all()[index].start()

    def heal(self) -> None:
        for ensemble in self._all():
            ensemble.heal()

    def flushall(self) -> None:
        for ensemble in self._all():
            ensemble.flushall()  # it finds a member that answers


class Ensemble(Group[M]):
    """One lock node of several members (each with ``endpoint``), its URL
    ``scheme://`` with them all, their data under ``dir``: a subclass provides
    ``start()``, which starts the members not running."""

    dir: str
    scheme: str

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url}>"

    @property
    def url(self) -> str:
        return f"{self.scheme}://" + ",".join(m.endpoint for m in self._all())

    def start(self) -> Any:
        raise NotImplementedError

    def _begin(self, start: bool) -> None:
        if start:
            with closed_on_error(self):
                self.start()

    def _wait_ready(
        self, ready: Callable[[list[Any]], bool], what: str, timeout: float, interval: float
    ) -> None:
        """Wait until ``ready`` (given the members up) says so.

        Raises:
            RuntimeError: not by ``timeout``, or every member died; with their logs' tails.
        """
        deadline = time.monotonic() + timeout
        while not ready([member for member in self._all() if _up(member)]):
            dead = [m for m in self._all() if m._proc is not None and not m.is_running]
            if time.monotonic() > deadline or len(dead) == len(self._all()):
                tails = "\n".join(f"{m!r}:\n{m.log_tail()}" for m in self._all())
                raise RuntimeError(f"{what} did not become ready:\n{tails}")
            time.sleep(interval)

    def started_here(self) -> bool:
        return all(member.started_here() for member in self._all())

    def heal(self) -> None:
        """Resume paused members and start stopped ones (their data kept)."""
        if not all(_up(member) for member in self._all()):
            self.start()

    def close(self) -> None:
        """Stop every member and delete the data directories."""
        for member in self._all():
            member.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

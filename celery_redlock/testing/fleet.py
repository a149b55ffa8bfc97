"""What every fleet of test lock nodes shares: a list of lock nodes a test indexes,
iterates and closes, whose ``urls`` make one quorum, with the fault verbs by index.

:class:`~celery_redlock.testing.RedisNodes` set the verbs; the fleets of the other
kinds answer to the same ones, so that one test body can drive any kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

M = TypeVar("M")
F = TypeVar("F", bound="Fleet[Any]")


class Fleet(Generic[M]):
    """Lock nodes ``members``, each with ``url``, ``keys()``, ``flushall()`` and ``close()``."""

    members: list[M]

    def _fill(self, n: int, make: Callable[[], M]) -> None:
        """Make ``n`` members; if one fails, close those made and raise."""
        self.members = []
        try:
            for _ in range(n):
                self.members.append(make())
        except BaseException:
            self.close()
            raise

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int) -> M:
        return self.members[index]

    def __iter__(self) -> Iterator[M]:
        return iter(self.members)

    def __enter__(self: F) -> F:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self._all()]

    def _all(self) -> list[Any]:
        return self.members

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

    def _processes(self, index: int) -> Iterable[Any]:
        return [self.members[index]]

    def _answers(self, node: Any) -> bool:
        return bool(node.is_running and not node.is_paused)

    def kill(self, index: int) -> None:
        for process in self._processes(index):
            process.kill()

    def pause(self, index: int) -> None:
        for process in self._processes(index):
            process.pause()

    def resume(self, index: int) -> None:
        for process in self._processes(index):
            process.resume()

    def restart(self, index: int) -> None:
        self._all()[index].restart()

    def heal(self) -> None:
        """Resume paused nodes and start stopped ones (their data kept)."""
        for node in self._all():
            node.resume()
            node.start()


class EnsembleFleet(ServerFleet[M]):
    """A fleet whose lock nodes are ensembles of members (etcd, ZooKeeper): the
    verbs act on every member of ensemble ``i``; it answers while one member does."""

    def _processes(self, index: int) -> Iterable[Any]:
        return list(self._all()[index])

    def _answers(self, node: Any) -> bool:
        return any(super(EnsembleFleet, self)._answers(m) for m in node)

    def restart(self, index: int) -> None:
        self.kill(index)
        self._all()[index].start()

    def heal(self) -> None:
        for ensemble in self._all():
            ensemble.heal()

    def flushall(self) -> None:
        for ensemble in self._all():
            ensemble.flushall()  # it finds a member that answers

"""The critical section that the threads of a fault test take turns in."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["Section"]


class Section:
    """The critical section the threads of a test take turns in: the tokens in
    grant order, and how often a holder found another one inside."""

    def __init__(self) -> None:
        self.grants: list[int] = []
        self.times: list[float] = []
        self.overlaps = 0
        self._inside = 0
        self._guard = threading.Lock()

    @contextlib.contextmanager
    def held(self, token: int) -> Iterator[None]:
        with self._guard:
            self._inside += 1
            self.overlaps += self._inside > 1
            self.grants.append(token)
            self.times.append(time.monotonic())
        try:
            time.sleep(0.001)  # a window for a second holder to be seen in
            yield
        finally:
            with self._guard:
                self._inside -= 1

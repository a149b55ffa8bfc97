"""Polling for a condition, without Celery: the core's tests use it too."""

from __future__ import annotations

import time
from typing import Any


def wait_for(predicate: Any, timeout: float = 10.0, what: str = "", interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)

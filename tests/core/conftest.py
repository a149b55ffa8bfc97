"""Fixtures of the core's tests, which need no Celery.

Every test module under ``tests/core`` (and this conftest) imports neither
celery nor kombu, nor any support module that does:
``tests/unit/test_package.py`` imports each of them where Celery cannot be
imported. Their nodes come from :mod:`celery_redlock.testing`.
"""

from __future__ import annotations

import pytest

from celery_redlock.core import heartbeat


@pytest.fixture
def default_heartbeat():
    """The process's heartbeat, emptied and stopped after the test."""
    yield heartbeat.default
    for lease in heartbeat.held():
        heartbeat.drop(lease)
    heartbeat.stop(timeout=5)

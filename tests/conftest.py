"""Fixtures shared by the unit and the integration tests."""

import pytest

from celery_redlock import heartbeat


@pytest.fixture
def default_heartbeat():
    """The process's heartbeat, emptied and stopped after the test."""
    yield heartbeat.default
    for lease in heartbeat.held():
        heartbeat.drop(lease)
    heartbeat.stop(timeout=5)

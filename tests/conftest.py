"""Fixtures shared by the unit and the integration tests."""

import os
import sys

import pytest

from celery_redlock import heartbeat

# The suite's helper modules in this folder (recorded_grants.py) import by name,
# whatever the import mode.
if os.path.dirname(os.path.abspath(__file__)) not in sys.path:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def default_heartbeat():
    """The process's heartbeat, emptied and stopped after the test."""
    yield heartbeat.default
    for lease in heartbeat.held():
        heartbeat.drop(lease)
    heartbeat.stop(timeout=5)

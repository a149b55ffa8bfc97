"""The operations the core asks of the nodes, and what a node answers: typed values.

An operation (:mod:`.operations`) is an immutable value naming everything one
call on one node needs (its keys, its owner, its TTL in ms, its gates...); a
result (:mod:`.results`) is one per answer; both are :func:`value` classes.
They cross the node seam both ways: the core builds operations and reads
results' fields, and the codec under the seam
(:mod:`celery_redlock.core.nodes.codec`) is the one place that turns them into
what a kind runs (today: the scripts' KEYS and ARGV) and a kind's reply back
into a result. Times on the nodes are whole ms; ids and owners are text.
"""

from __future__ import annotations

from . import operations, results
from .base import value
from .operations import *  # noqa: F403 - the operations, listed once there
from .results import *  # noqa: F403 - the results, listed once there

__all__ = [*operations.__all__, *results.__all__, "value"]

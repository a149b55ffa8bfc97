"""``celery -A proj redlock ...``: look at, and clear, the locks of a Celery app.

Installed through the ``celery.commands`` entry point, so every sub-command
runs with the app ``-A`` names::

    celery -A proj redlock nodes                      # health of the lock nodes
    celery -A proj redlock status proj.settle --args '[42]'
    celery -A proj redlock list [proj.settle]
    celery -A proj redlock release proj.settle --args '[42]' [--force | --task-id ID]
    celery -A proj redlock beat-slots [ENTRY]
    celery -A proj redlock settings [proj.settle]
    celery -A proj redlock web [--port 8089] [--actions --token T]   # a live dashboard

Output is plain text in aligned columns (``status --json`` for scripts).

Exit codes: 0 done; 1 bad input, a misconfiguration, or nothing done
(``release --task-id`` of a lock someone else holds); 2 fewer than a quorum of
the lock nodes answered (and Click's own usage errors).

The commands open their own connections with ``--timeout`` (default 0.5 s)
per node and round instead of ``redlock_node_timeout``: an operator on another
network should see a slow node as slow, not as down. ``nodes`` flags a node
slower than ``redlock_node_timeout``, because the workers do count it as down.
Keys are found with ``SCAN`` (never ``KEYS``) and the listings stop at
``--limit`` keys per node.
"""

from __future__ import annotations

# Importing each command module adds its commands to the group.
from . import beat_slots, locks, nodes, schema, settings, status, web  # noqa: F401
from .base import redlock

__all__ = ["redlock"]

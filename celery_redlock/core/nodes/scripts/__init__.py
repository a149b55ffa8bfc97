"""The Lua scripts run on every node, grouped by primitive.

* :mod:`.shared`: the :class:`Script` record and the helpers composed into the
  scripts (token comparison and successor, owner check, fence seeding, the
  gates an acquire checks for its caller's id);
* :mod:`.lease`: acquire, a lazy lease's token, fence, extend, release;
* :mod:`.permits`: the acquire of one of K permits, with other names held together;
* :mod:`.claims`: claims and the schedules of coalesced calls;
* :mod:`.queues`: a name's waiting calls in publish order, and the hand-over;
* :mod:`.rates`: the rate reservation (GCRA per window, two phases), and the
  acquires that book a rated start in their own round;
* :mod:`.inspect`: the read-only views.

Every script is idempotent when re-sent, so a reply lost to a timeout never
turns into a wrong answer on the next call (a re-sent ``ISSUE`` moves a fence
value on once more: tokens skip a number and never go back). Callers look a script up here at
call time (``scripts.ACQUIRE``), so this module is the one place that names them.
"""

from __future__ import annotations

from .claims import CLAIM, CLAIM_NEXT, DEBOUNCE, THROTTLE
from .inspect import INSPECT, PEEK
from .lease import ACQUIRE, EXTEND, FENCE, ISSUE, RELEASE, RELEASE_PREFIX
from .permits import ACQUIRE_PERMIT
from .queues import QUEUE_NEXT, QUEUE_PARK, QUEUE_PEEK
from .rates import ACQUIRE_PERMIT_RATED, ACQUIRE_RATED, RATE, UNSTART
from .shared import Script

__all__ = [
    "ACQUIRE",
    "ACQUIRE_PERMIT",
    "ACQUIRE_PERMIT_RATED",
    "ACQUIRE_RATED",
    "CLAIM",
    "CLAIM_NEXT",
    "DEBOUNCE",
    "EXTEND",
    "FENCE",
    "INSPECT",
    "ISSUE",
    "PEEK",
    "QUEUE_NEXT",
    "QUEUE_PARK",
    "QUEUE_PEEK",
    "RATE",
    "RELEASE",
    "RELEASE_PREFIX",
    "Script",
    "THROTTLE",
    "UNSTART",
]

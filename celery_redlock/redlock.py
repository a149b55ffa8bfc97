"""The lock client's former home: the names now live in :mod:`celery_redlock.core`.

Kept so that ``from celery_redlock.redlock import Redlock, Lease, ...`` works.
"""

from __future__ import annotations

from .core import (
    Claim,
    ClaimView,
    Deletion,
    Finished,
    Holder,
    Lease,
    NodeInfo,
    NodeView,
    Redlock,
    ScanResult,
    Schedule,
    TooEarly,
    full_jitter,
    make_owner,
    mask_url,
    node_name,
)

__all__ = [
    "Claim",
    "ClaimView",
    "Deletion",
    "Finished",
    "Holder",
    "Lease",
    "NodeInfo",
    "NodeView",
    "Redlock",
    "ScanResult",
    "Schedule",
    "TooEarly",
    "full_jitter",
    "make_owner",
    "mask_url",
    "node_name",
]

"""Counting instants per window, as the rates page states its bounds."""

from __future__ import annotations


def most_in_window(instants: list[float], period: float) -> int:
    """The most instants in any half-open window [t, t + period)."""
    ordered = sorted(instants)
    best, j = 0, 0
    for i, start in enumerate(ordered):
        while j < len(ordered) and ordered[j] < start + period - 1e-6:
            j += 1
        best = max(best, j - i)
    return best

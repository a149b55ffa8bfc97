"""Counting instants per window, as the rates page states its bounds."""

from __future__ import annotations

import math


def most_in_window(instants: list[float], period: float) -> int:
    """The most instants in any half-open window [t, t + period)."""
    ordered = sorted(instants)
    best, j = 0, 0
    for i, start in enumerate(ordered):
        while j < len(ordered) and ordered[j] < start + period - 1e-6:
            j += 1
        best = max(best, j - i)
    return best


def lag(record: dict) -> float:
    """The rates page's d for a recorded start: from its grace check ("checked", when
    it checked one: a start on its booking) to its body, else its lock round's age
    ("round": a start booked in that round comes no earlier than the round began)."""
    checked = record.get("checked")
    since = record["start"] - checked if checked is not None else 0.0
    return max(0.0, record["round"], since)


def assert_rate(records: list[dict], n: int, period: float, spacing: float = 0.0) -> None:
    """The rates page's bound on actual starts, burst 1: bookings ``spacing`` apart
    (T: period / n unless given) and a grace g of min(T, 0.5) / 2, so a start comes
    at most g + d after its instant, d from its grace check to its body (:func:`lag`).

    Any window of the period holds at most N + ceil((g + d) / T) starts, d the
    longest among its starts (the instants behind them lie in a window of
    the period widened by g + d), and its first period - g - d at most N. A loaded
    host lengthens d and so loosens the bound; the bookings' spacing never moves.
    """
    t = spacing or period / n
    g = min(t, 0.5) / 2
    runs = sorted((r["start"], lag(r)) for r in records)
    for i, (at, _) in enumerate(runs):
        inside = [d for s, d in runs[i:] if s < at + period - 1e-6]
        d = max(d for d in inside)
        bound = n + math.ceil((g + d) / t - 1e-9)
        assert len(inside) <= bound, (len(inside), "starts from", at, "d", d, "bound", bound)
        short = sum(s < at + period - g - d - 1e-6 for s, _ in runs[i:])
        assert short <= n, (short, "starts in", period - g - d, "s from", at)


def wasted_slots(records: list[dict], retries: list[dict], grace: float) -> int:
    """The booked instants a rated run gave up: each re-publish of a delivery that
    carried a booking (booked again, or its key held), other than one come early,
    and each start later than its booking's grace plus its d (:func:`lag`: booked
    again on the spot). A loaded host wastes them by design: a slot is wasted, never exceeded."""
    given_up = sum(
        r["booked"] is not None and not r["reason"].startswith("rate: early") for r in retries
    )
    late = sum(
        r["booked"] is not None and r["start"] - r["booked"] > grace + lag(r) for r in records
    )
    return given_up + late

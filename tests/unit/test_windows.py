"""The live rate tests' checks on made-up starts: the bound (``assert_rate``) holds the
rates page's N + ceil((g + d) / T) and fails past it; ``wasted_slots`` counts the
booked instants a run gave up."""

from __future__ import annotations

import pytest

from tests.support.windows import assert_rate, wasted_slots


def starts(at: list[float], d: float) -> list[dict]:
    return [{"start": t, "round": d} for t in at]


def test_a_schedule_at_the_rate_passes_with_short_rounds():
    assert_rate(starts([i / 10 for i in range(30)], 0.005), 10, 1.0)


def test_one_start_late_by_its_grace_and_round_is_the_one_extra():
    # instants 0.0 .. 0.9; the first start comes g + d late, so [0.04, 1.04) holds 10
    # and a start on instant 1.0 makes 11 = N + ceil((0.05 + 0.04) / 0.1)
    at = [0.09] + [i / 10 for i in range(1, 11)]
    records = starts(at, 0.04)
    assert_rate(records, 10, 1.0)
    with pytest.raises(AssertionError):
        assert_rate(records + starts([1.05], 0.04), 10, 1.0)


def test_a_long_round_loosens_the_bound_by_what_it_explains():
    # 12 starts within a second: N + 2 needs g + d past T
    at = [0.5 + i / 12 for i in range(12)]
    with pytest.raises(AssertionError):
        assert_rate(starts(at, 0.01), 10, 1.0)
    assert_rate(starts(at, 0.12), 10, 1.0)


def test_a_start_descheduled_after_its_grace_check_is_bounded_from_the_check():
    # the first start checked its grace 0.02 s after its instant 0.0 and was held
    # 0.2 s before its 0.04 s round: eleven starts within 0.9 s, none of them early
    first = {"start": 0.26, "round": 0.04, "checked": 0.02}
    rest = starts([i / 10 for i in range(1, 11)], 0.04)
    with pytest.raises(AssertionError):
        assert_rate([{**first, "checked": None}, *rest], 10, 1.0)
    assert_rate([first, *rest], 10, 1.0)


def test_the_short_window_holds_n():
    # 11 starts in 0.9 s with short rounds: over N in period - g - d
    with pytest.raises(AssertionError):
        assert_rate(starts([i * 0.09 for i in range(11)], 0.0), 10, 1.0)


def test_wasted_slots_are_the_bookings_given_up():
    records = [
        {"start": 10.02, "booked": 10.0, "round": 0.01},  # on its booking
        {"start": 10.30, "booked": 10.1, "round": 0.01},  # late: booked again on the spot
        {"start": 10.40, "booked": 10.38, "round": 0.0},  # the re-published one, on time
        {"start": 10.5, "booked": None, "round": 0.01},  # booked on arrival
    ]
    retries = [
        {"reason": "rate: starts in 2.000s", "booked": 10.2},  # late, booked again
        {"reason": "rate: starts in 0.900s", "booked": None},  # a first booking
        {"reason": "rate: early", "booked": 10.6},  # keeps its booking
    ]
    assert wasted_slots(records, retries, grace=0.05) == 2
    # on its booking, checked in its grace, then held before its round: not wasted
    held = {"start": 10.35, "booked": 10.0, "round": 0.01, "checked": 10.03}
    assert wasted_slots([held], [], grace=0.05) == 0
    assert wasted_slots([{**held, "checked": 10.06}], [], grace=0.05) == 1
    assert wasted_slots(records[:1], [], grace=0.05) == 0

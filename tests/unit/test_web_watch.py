"""The dashboard's memory of holders between reads: age, renewals, suspects."""

from __future__ import annotations

from celery_redlock.web.watch import Watch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_renewed_holder_is_never_suspect():
    clock = Clock()
    watch = Watch(clock, grace=1.0)
    for _ in range(20):  # ttl 9 s, renewed every 3 s, read every second
        for left in (9.0, 8.0, 7.0):
            seen = watch.see("k", "owner", left)
            assert not seen.suspect
            clock.now += 1.0
    assert seen.age > 55


def test_a_holder_that_is_not_renewed_turns_suspect_before_its_key_expires():
    clock = Clock()
    watch = Watch(clock, grace=1.0)
    left, flags = 9.0, []
    while left > 0:
        flags.append(watch.see("k", "owner", left).suspect)
        clock.now += 0.5
        left -= 0.5
    # peak 9 s: suspect once more than 4.5 s + 1 s pass without a rise (3 s still left).
    assert flags.index(True) == 12 and all(flags[12:]) and not any(flags[:12])


def test_a_new_owner_starts_afresh_and_old_pairs_are_forgotten():
    clock = Clock()
    watch = Watch(clock)
    watch.see("k", "a", 5.0)
    clock.now += 30
    seen = watch.see("k", "b", 5.0)
    assert seen.age == 0 and not seen.suspect
    clock.now += 1000
    watch.prune()
    assert watch.see("k", "b", 5.0).age == 0

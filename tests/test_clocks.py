"""The race that decides between two kernels on this machine (gpt/clocks.py:race): it stops once the times are apart.

The calls here advance a clock of the test's own (the race's `time.perf_counter`, patched) by known milliseconds, so
the rounds the race takes are known exactly: apart after its 5 rounds, until its time is up while they overlap, and
the medians it returns are each call's own.
(Sleeps of known lengths were not known enough: on a loaded 2-core CI machine a 1 ms sleep once took over 4 ms.)"""

import itertools
import types

import pytest
from pytest import approx

from gpt import clocks
from gpt.clocks import race


class Clock:
    """A host clock that moves only when a call or a wait says how long it took."""

    def __init__(self):
        self.now, self.calls = 0.0, 0

    def __call__(self) -> float:
        return self.now

    def call(self, *milliseconds: float):
        """A call that takes each of `milliseconds` in turn, cycling; it counts its calls in `self.calls`."""
        taken = itertools.cycle(milliseconds)

        def call():
            self.calls += 1
            self.now += next(taken) / 1e3

        return call


@pytest.fixture
def clock(monkeypatch) -> Clock:
    """The test's clock, read by the race in place of the host's."""
    clock = Clock()
    monkeypatch.setattr(clocks, "time", types.SimpleNamespace(perf_counter=clock))
    return clock


def test_two_calls_far_apart_take_five_rounds_and_give_their_own_medians(clock):
    """Two calls 4x apart: 5 rounds, and each call's own median.

    Seen failing on a version that checked from the first round (it stopped after one) and on one that ran until its
    seconds were up (hundreds of rounds)."""
    fast, slow = race([clock.call(1.0, 1.2, 0.9), clock.call(4.0, 4.4)], seconds=5.0)
    assert clock.calls == 10  # 5 rounds of each: the samples apart at the first check
    assert (fast, slow) == approx((1.0, 4.0))


def test_two_calls_alike_run_until_the_time_is_up(clock):
    """Two calls whose times overlap run the race's whole time: 40 rounds of 5 ms, not 10."""
    medians = race([clock.call(2.0, 3.0), clock.call(2.5)], rounds=10, seconds=0.1995)
    assert clock.calls == 80  # 40 rounds of 5 ms: the first at or past 0.1995 s
    assert medians == approx([2.5, 2.5])


def test_one_late_call_keeps_the_race_going_and_the_medians_still_rank_them(clock):
    """A fast call once slower than the slow one's fastest (the OS woke it late): the race runs its time out.

    The samples overlap from then on, and the medians still put the fast call first."""
    fast, slow = race([clock.call(5.0, 1.0, 1.0, 1.0), clock.call(4.0)], seconds=0.1)
    assert clock.calls > 10 and clock.now >= 0.1
    assert (fast, slow) == approx((1.0, 4.0))


def test_the_wait_runs_after_every_call_inside_its_time(clock):
    """`wait` (a GPU's synchronize) runs after each call and counts in the call's time."""
    waits = []

    def wait():
        waits.append(clock.now)
        clock.now += 3e-3

    fast, slow = race([clock.call(1.0), clock.call(2.0)], wait=wait)
    assert len(waits) == clock.calls == 10 and (fast, slow) == approx((4.0, 5.0))

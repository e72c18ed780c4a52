"""The race that decides between two kernels on this machine (gpt/clocks.py:race): it stops once the times are apart.

The calls here are sleeps of known lengths, so the rounds the race takes are known: apart after its 5 rounds, until
its time is up while they overlap, and the medians it returns are each call's own."""

import time

from gpt.clocks import race


def sleeper(seconds: float, calls: list):
    def call():
        calls.append(seconds)
        time.sleep(seconds)

    return call


def test_two_calls_far_apart_take_five_rounds_and_give_their_own_medians():
    """Two calls 4x apart: 5 rounds, and each call's own median.

    Seen failing on a version that checked from the first round (it stopped after one) and on one that ran until its
    seconds were up (hundreds of rounds)."""
    calls = []
    fast, slow = race([sleeper(0.001, calls), sleeper(0.004, calls)], seconds=5.0)
    assert len(calls) == 10  # 5 rounds of each: the samples apart at the first check
    assert 1.0 <= fast < 2.5 and 4.0 <= slow < 5.5 and fast < slow


def test_two_calls_alike_run_until_the_time_is_up():
    """Equal sleeps overlap (the OS wakes each a little late), so the race runs its 0.2 s: far more than 10 rounds.

    At 10 rounds, not 5, two equal calls look apart at the first check once in 184,756, not once in 252 (and samples
    that overlap once overlap from then on): the test does not depend on that luck."""
    calls = []
    t0 = time.perf_counter()
    medians = race([sleeper(0.002, calls), sleeper(0.002, calls)], rounds=10, seconds=0.2)
    assert time.perf_counter() - t0 >= 0.2 and len(calls) > 20
    assert all(2.0 <= m < 3.5 for m in medians)


def test_the_wait_runs_after_every_call_inside_its_time():
    """`wait` (a GPU's synchronize) runs after each call and counts in the call's time."""
    calls, waits = [], []
    wait = lambda: waits.append(time.sleep(0.003))  # noqa: E731
    fast, slow = race([sleeper(0.001, calls), sleeper(0.001, calls)], wait=wait, rounds=10, seconds=0.1)
    assert len(waits) == len(calls) and fast >= 4.0 and slow >= 4.0

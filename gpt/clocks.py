"""Clocks of the timed loop: per-step durations without a host sync inside it, and what feeding the device costs.

The repeats' own clock is time.perf_counter between two synchronisations (gpt/protocol.py:timed_repeats); the process's
own age, read from the OS, splits a run to a loss's wall clock (gpt/time_to_loss.py).
"""

import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch

from gpt.step_profiler import step_phase


class StepClock:
    """Per-step durations without a host sync inside the timed loop.

    On CUDA a step's time is read from CUDA events after the repeat's final synchronize; on CPU the
    host clock is the device clock."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)
        else:
            self.marks.append(time.perf_counter())

    def durations(self) -> list[float]:
        """Seconds between consecutive marks; call after synchronize()."""
        if self.cuda:
            return [a.elapsed_time(b) / 1e3 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def beyond_steady(startup_steps_s: list[float], steady_s: float) -> list[float]:
    """What each start-up step took beyond a steady step, never below 0: its start-up (compile_s, startup_s)."""
    return [max(0.0, s - steady_s) for s in startup_steps_s]


class FeedClock:
    """What feeding the device costs per step: the wait for the DataLoader's next batch and the host-to-device copy.

    Kept apart because a blocking copy from pageable memory first waits for the GPU work already queued: on CUDA the
    copy is timed with CUDA events (docs/measurement.md), on the CPU with the host clock."""

    def __init__(self, device: torch.device):
        self.data_s: list[float] = []
        self._copy = StepClock(device)  # marks in pairs: before and after each copy

    @contextmanager
    def data(self):
        t0 = time.perf_counter()
        with step_phase("data"):
            yield
        self.data_s.append(time.perf_counter() - t0)

    @contextmanager
    def copy(self):
        self._copy.mark()
        with step_phase("copy"):
            yield
        self._copy.mark()

    def copy_s(self) -> list[float]:
        """Seconds of each copy; call after synchronize()."""
        return self._copy.durations()[::2]


def race(
    calls: Sequence[Callable[[], None]], wait: Callable[[], None] = lambda: None, rounds: int = 5, seconds: float = 0.6
) -> list[float]:
    """The median milliseconds of each of `calls`, timed in turns until their times no longer overlap, or `seconds`.

    A round times each call once (`wait()` after it: a GPU's queued kernels). After at least `rounds` rounds the race
    stops as soon as the call of the lowest median has every time under every other call's fastest: two calls equally
    fast look that far apart after 5 rounds once in 252 (the order of 10 times drawn alike; samples that overlap once
    overlap from then on), and then either is the right choice. A per-machine decision between kernels 2x apart
    takes 5 rounds; close ones take up to `seconds`."""
    times: list[list[float]] = [[] for _ in calls]
    end = time.perf_counter() + seconds
    while True:
        for call, taken in zip(calls, times):
            t0 = time.perf_counter()
            call()
            wait()
            taken.append(time.perf_counter() - t0)
        if len(times[0]) >= rounds:
            medians = [statistics.median(t) for t in times]
            fastest = medians.index(min(medians))
            slowest_of_fastest = max(times[fastest])
            if time.perf_counter() >= end or all(
                min(t) > slowest_of_fastest for i, t in enumerate(times) if i != fastest
            ):
                return [1e3 * m for m in medians]


def process_age_s(proc: Path = Path("/proc")) -> float | None:
    """Seconds since this process started, as the OS counts them (imports before any Python line of ours included).

    Its start in /proc/self/stat against the boot-time clock now; None without /proc (not Linux) or a negative age."""
    try:
        stat = (proc / "self" / "stat").read_text()
        started = int(stat.rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - started
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if age >= 0 else None


def minor_page_faults() -> int | None:
    """Minor page faults of this process so far (pages the kernel mapped in); None where the OS does not count them."""
    try:
        import resource
    except ImportError:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

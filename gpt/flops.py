"""Peak FLOPS and MFU: GPUs' data-sheet peaks, a CPU's measured matmul rate, model FLOPs utilisation against either.

The CPU's rate is benchmarked once per CPU model, thread count, dtype and torch version, and cached on disk
(docs/measurement.md, MFU).
"""

import re
import time
from contextlib import contextmanager

import torch

from gpt import machine_cache

# Dense (no sparsity) peak TFLOPS from the vendors' data sheets, by board and dtype.
# fp32 means plain FP32 (no TF32): the reference ran fp32 without TF32.
GPU_PEAK_TFLOPS = {
    "H100 SXM": {"float32": 67.0, "bfloat16": 989.4, "float16": 989.4},
    "H100 NVL": {"float32": 60.0, "bfloat16": 835.0, "float16": 835.0},
    "H100 PCIe": {"float32": 51.2, "bfloat16": 756.5, "float16": 756.5},
    "H200 SXM": {"float32": 67.0, "bfloat16": 989.4, "float16": 989.4},
    "H200 NVL": {"float32": 60.0, "bfloat16": 835.5, "float16": 835.5},
    "A100": {"float32": 19.5, "bfloat16": 312.0, "float16": 312.0},  # SXM4 and PCIe alike
    "A10G": {"float32": 31.2, "bfloat16": 70.0, "float16": 70.0},
    "L40S": {"float32": 91.6, "bfloat16": 362.05, "float16": 362.05},
    "L40": {"float32": 90.5, "bfloat16": 181.05, "float16": 181.05},
    "L4": {"float32": 30.3, "bfloat16": 121.0, "float16": 121.0},
    "RTX 4090": {"float32": 82.6, "bfloat16": 165.2, "float16": 165.2},
    "RTX 3090": {"float32": 35.6, "bfloat16": 71.0, "float16": 71.0},
    "V100 SXM2": {"float32": 15.7, "float16": 125.0},
    "V100 PCIe": {"float32": 14.0, "float16": 112.0},
    "T4": {"float32": 8.1, "float16": 65.0},
}

# torch.cuda.get_device_name as the driver reports it, upper case, without "NVIDIA", "Tesla", "GeForce" and the
# memory size ("NVIDIA A100-SXM4-80GB" -> "A100 SXM4") -> its row above. Only exact names match: "L40" is not
# "L4", "H200 NVL" is not the H200 SXM; an unknown name gets no MFU rather than another board's peak.
GPU_NAMES = {
    "H100 HBM3": "H100 SXM",
    "H100 SXM5": "H100 SXM",
    "H100 NVL": "H100 NVL",
    "H100 PCIE": "H100 PCIe",
    "H200": "H200 SXM",
    "H200 NVL": "H200 NVL",
    "A100": "A100",
    "A100 SXM4": "A100",
    "A100 PCIE": "A100",
    "A10G": "A10G",
    "L40S": "L40S",
    "L40": "L40",
    "L4": "L4",
    "RTX 4090": "RTX 4090",
    "RTX 3090": "RTX 3090",
    "V100 SXM2": "V100 SXM2",
    "V100 PCIE": "V100 PCIe",
    "T4": "T4",
}


def gpu_board(name: str) -> str | None:
    """The GPU_PEAK_TFLOPS row of a CUDA device name, or None if the name is not one the table knows."""
    words = [
        w
        for w in re.split(r"[\s-]+", name.strip().upper())
        if w not in ("NVIDIA", "TESLA", "GEFORCE") and not re.fullmatch(r"\d+GB", w)
    ]
    return GPU_NAMES.get(" ".join(words))


PEAKS_CACHE = "cpu_peak_flops"  # gpt/machine_cache.py's file of measured matmul peaks


def peak_label(dtype: torch.dtype, threads: int) -> str:
    """How machine.json and the report name a measured CPU peak, e.g. "float32 x2 threads"."""
    return f"{str(dtype).removeprefix('torch.')} x{threads} threads"


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(peak FLOP/s of one device in `dtype`, where the figure comes from)."""
    dt = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        board = gpu_board(name)
        if board and dt in GPU_PEAK_TFLOPS[board]:
            return GPU_PEAK_TFLOPS[board][dt] * 1e12, f"data sheet: {board} {dt} dense"
        return None, (
            f"no data-sheet peak for {name!r} in {dt} (add it to GPU_PEAK_TFLOPS and GPU_NAMES in gpt/flops.py)"
        )
    return measure_cpu_matmul_flops(dtype), f"measured: {dt} matmul, {torch.get_num_threads()} thread(s)"


def fastest_peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The device's highest peak over the dtypes training can compute in (MFU against it: docs/measurement.md)."""
    dtypes = (torch.float32, torch.bfloat16) + ((torch.float16,) if device.type == "cuda" else ())
    peaks = [(flops, source) for flops, source in (peak_flops(device, dt) for dt in dtypes) if flops]
    return max(peaks, key=lambda p: p[0]) if peaks else (None, "no known peak for this device")


def measure_cpu_matmul_flops(
    dtype: torch.dtype, n: int = 2048, seconds: float = 2.0, rounds: int = 1, fresh: bool = False
) -> float:
    """Best FLOP/s of an n x n matmul on this CPU with the current thread count, cached on disk (`fresh`: anew).

    `rounds` spreads the `seconds` over that many rounds, a second apart, and keeps the best (a VM's neighbours move the
    rate for seconds at a time). A dtype the CPU has no instructions for (bf16 on AVX2: ~1 GFLOP/s) would take a minute
    per 2048 x 2048 matmul: the size doubles from 256 only while one matmul takes under a quarter of a round."""
    return machine_cache.remembered(
        PEAKS_CACHE, f"{dtype}|n={n}", lambda: matmul_rate(dtype, n, seconds, rounds), fresh
    )


def matmul_rate(dtype: torch.dtype, n: int = 2048, seconds: float = 2.0, rounds: int = 1) -> float:
    """The measurement behind measure_cpu_matmul_flops, uncached: best FLOP/s over `rounds` rounds."""
    round_s = seconds / rounds
    with _own_real_inputs():
        n = _matmul_size((dtype,), n, round_s / 4)
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        for _ in range(3):
            a @ b
        best = 0.0
        for i in range(rounds):
            if i:
                time.sleep(1.0)
            t_end = time.perf_counter() + round_s
            while time.perf_counter() < t_end:
                t0 = time.perf_counter()
                a @ b
                best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def measure_cpu_matmul_rates_in_turns(
    dtypes: tuple[torch.dtype, ...], n: int = 1024
) -> tuple[int, dict[torch.dtype, float]]:
    """matmul_rates_in_turns (the size measured, FLOP/s by dtype), cached on disk like the peaks."""
    what = f"in turns|{','.join(map(str, dtypes))}|n={n}"
    size, rates = machine_cache.remembered(PEAKS_CACHE, what, lambda: _listed(*matmul_rates_in_turns(dtypes, n)))
    return size, dict(zip(dtypes, rates))


def _listed(size: int, rates: dict) -> list:
    return [size, list(rates.values())]  # as JSON keeps it


def matmul_rates_in_turns(
    dtypes: tuple[torch.dtype, ...], n: int = 1024, seconds: float = 0.6
) -> tuple[int, dict[torch.dtype, float]]:
    """FLOP/s of each dtype's matmul at one size, from the median of calls timed in turns (gpt/clocks.py:race).

    For a decision between dtypes: a slowdown of the host for part of the measurement (a neighbour, a clock ramping
    up) then slows every dtype's calls alike, where one dtype timed after the other took it all (the bf16 rule chose
    fp32 once so, in the first run of c9ed59d). The size (returned first) is n, or smaller where one matmul of the
    slowest dtype would take too long for `seconds` (bf16 on AVX2: ~1 GFLOP/s)."""
    from gpt.clocks import race  # imported here: gpt.clocks needs the step profiler, which the peaks never do

    with _own_real_inputs():
        n = _matmul_size(dtypes, n, seconds / 8)
        pairs = [(torch.randn(n, n, dtype=dt), torch.randn(n, n, dtype=dt)) for dt in dtypes]
        calls = [lambda a=a, b=b: a @ b for a, b in pairs]
        for call in calls:
            call()  # the first call of a size pays for allocation and packing
        medians_ms = race(calls, seconds=seconds)
    return n, {dt: 2 * n**3 / (ms / 1e3) for dt, ms in zip(dtypes, medians_ms)}


@contextmanager
def _own_real_inputs():
    """Real tensors even under FakeTensorMode (the memory planner), drawn with the CPU's generator forked.

    A clock decides how many sizes a measurement tries, and a cached rate draws none, so drawn from the generator a run
    was seeded with they would move its dropout masks with a clock and a cache (docs/speedrun.md, the log of
    2026-12-06, later)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.random.fork_rng(devices=[]):
        yield


def _matmul_size(dtypes: tuple[torch.dtype, ...], n: int, budget_s: float) -> int:
    """n, or the first size from 256 up (doubling) where the next size's slowest matmul (8x longer) passes budget_s."""
    size = 256
    while size < n:
        mats = [torch.randn(size, size, dtype=dt) for dt in dtypes]
        slowest = 0.0
        for a in mats:
            a @ a  # the first call of a size pays for allocation and packing: time the second
            t0 = time.perf_counter()
            a @ a
            slowest = max(slowest, time.perf_counter() - t0)
        if 8 * slowest > budget_s:
            return size
        size *= 2
    return n


def calibrate_cpu_peaks(thread_counts: list[int], rounds: int = 5) -> dict[str, float]:
    """Measure afresh, before any stage runs, every CPU peak the stages will read: {"float32 x2 threads": FLOP/s, ...}.

    Fp32 and bf16 at each thread count the stages use, so no stage's MFU rests on one sample taken on a busy host."""
    before, peaks = torch.get_num_threads(), {}
    try:
        for threads in thread_counts:
            torch.set_num_threads(threads)
            for dtype in (torch.float32, torch.bfloat16):
                flops = measure_cpu_matmul_flops(dtype, seconds=rounds, rounds=rounds, fresh=True)
                peaks[peak_label(dtype, threads)] = flops
    finally:
        torch.set_num_threads(before)
    return peaks


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices used.

    Recomputation by activation checkpointing is not counted: it is work, not model progress."""
    if not peak:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)

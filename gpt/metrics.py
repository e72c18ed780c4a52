"""What a run measures: device choice, synchronised clocks, peak memory, device peak FLOPS and MFU.

Names follow torchtitan's metrics: peak active memory, tokens/s, MFU, data-loading %.
"""
import json
import os
import platform
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed._tools.mem_tracker import MemTracker

from gpt.errors import UserError
from gpt.profiling import region

MiB = 2**20


# ----------------------------------------------------------------------------------------------------------
# device


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present. Under torchrun each rank takes the GPU of its LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda was asked for but this PyTorch build sees no CUDA GPU")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if name == "cpu":
        return torch.device("cpu")
    raise UserError(f"unknown device {name!r} (choose auto, cpu or cuda)")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or _cpu_model() or "cpu"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before reading a clock. CPU ops are synchronous (and
    torch.cuda.synchronize raises on a CPU-only build), so there is nothing to wait for."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


class FeedClock:
    """What feeding the device costs, per step: host seconds waiting for the DataLoader's next batch, and
    seconds of the host-to-device copy. Both are also profiler phases ("data", "copy").

    Kept apart because a blocking copy from pageable memory first waits for all GPU work already queued: a
    host clock around it would count compute as copying. On CUDA the copy is timed with CUDA events around it
    (the copy on the GPU's stream, read after the repeat's synchronize); on the CPU the host clock is the
    device clock."""

    def __init__(self, device: torch.device):
        self.data_s: list[float] = []
        self._copy = StepClock(device)  # marks in pairs: before and after each copy

    @contextmanager
    def data(self):
        t0 = time.perf_counter()
        with region("data"):
            yield
        self.data_s.append(time.perf_counter() - t0)

    @contextmanager
    def copy(self):
        self._copy.mark()
        with region("copy"):
            yield
        self._copy.mark()

    def copy_s(self) -> list[float]:
        """Seconds of each copy; call after synchronize()."""
        return self._copy.durations()[::2]


# ----------------------------------------------------------------------------------------------------------
# memory


class TimelineMemTracker(MemTracker):
    """PyTorch's MemTracker (live tensor storage bytes by category: parameters, gradients, optimizer
    state, activations, temporaries) that also records the total after every op, for a
    memory-over-time curve. It sees what goes through the dispatcher: on CPU this matches the
    allocator within ~0.1 MiB for eager code. Under FakeTensorMode it works without allocating."""

    def __init__(self):
        super().__init__()
        self.timeline: list[int] = []

    def _pre_fw_hook(self, module, inputs):
        # The root's second forward in one tracked step is the next micro-batch (gradient accumulation).
        # MemTracker keeps per-module statistics for a single call and refuses a second; only the running
        # totals are used here, so the per-module statistics start afresh.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        self.timeline.append(sum(snap["Total"] for snap in self._curr_mem_snap.values()))
        return res


def memory_breakdown(tracker: MemTracker) -> dict:
    """Peak snapshot of a tracker as {'parameters': MiB, ..., 'total': MiB}, summed over devices."""
    names = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients", "OPT": "optimizer_state",
             "ACT": "activations", "TEMP": "temporaries", "OTH": "other", "Total": "total"}
    out = dict.fromkeys(names.values(), 0.0)
    for snap in tracker.get_tracker_snapshot("peak").values():
        for key, nbytes in snap.items():
            out[names[str(key).split(".")[-1]]] += nbytes / MiB
    return {k: round(v, 2) for k, v in out.items()}


def reset_cuda_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peak_mib(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / MiB
    return None


# ----------------------------------------------------------------------------------------------------------
# peak FLOPS and MFU

# Dense (no sparsity) peak TFLOPS from the vendors' data sheets, by (name fragment, dtype).
# fp32 means plain FP32 (no TF32): the reference ran fp32 without TF32.
GPU_PEAK_TFLOPS = {
    "H100 SXM": {"float32": 67.0, "bfloat16": 989.4, "float16": 989.4},
    "H100 NVL": {"float32": 60.0, "bfloat16": 835.0, "float16": 835.0},
    "H100": {"float32": 51.2, "bfloat16": 756.5, "float16": 756.5},  # PCIe
    "H200": {"float32": 67.0, "bfloat16": 989.4, "float16": 989.4},
    "A100": {"float32": 19.5, "bfloat16": 312.0, "float16": 312.0},
    "A10G": {"float32": 31.2, "bfloat16": 70.0, "float16": 70.0},
    "L40S": {"float32": 91.6, "bfloat16": 362.1, "float16": 362.1},
    "L4": {"float32": 30.3, "bfloat16": 121.0, "float16": 121.0},
    "RTX 4090": {"float32": 82.6, "bfloat16": 165.2, "float16": 165.2},
    "RTX 3090": {"float32": 35.6, "bfloat16": 71.0, "float16": 71.0},
    "V100": {"float32": 15.7, "float16": 125.0},
    "T4": {"float32": 8.1, "float16": 65.0},
}

_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt-ladder" / "cpu_peak_flops.json"


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float | None, str]:
    """(peak FLOP/s of one device in `dtype`, where the figure comes from)."""
    dt = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        # H100 SXM reports as "NVIDIA H100 80GB HBM3"; PCIe as "NVIDIA H100 PCIe".
        if "H100" in name and "HBM3" in name:
            name = "H100 SXM"
        for key, table in GPU_PEAK_TFLOPS.items():
            if key in name and dt in table:
                return table[dt] * 1e12, f"data sheet: {key} {dt} dense"
        return None, f"unknown GPU {name!r}: add it to GPU_PEAK_TFLOPS in gpt/metrics.py"
    return measure_cpu_matmul_flops(dtype), f"measured: {dt} matmul, {torch.get_num_threads()} thread(s)"


def measure_cpu_matmul_flops(dtype: torch.dtype, n: int = 2048, seconds: float = 2.0) -> float:
    """Best FLOP/s of an n x n matmul on this CPU with the current thread count, cached on disk
    (keyed by CPU model, threads, dtype and torch version) so every stage uses the same figure."""
    key = f"{_cpu_model()}|threads={torch.get_num_threads()}|{dtype}|torch={torch.__version__}|n={n}"
    try:
        cache = json.loads(_CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return cache[key]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(3):
        a @ b
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        a @ b
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    cache[key] = best
    try:
        _CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = _CACHE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, _CACHE)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return best


def mfu(tokens_per_s: float, flops_per_token: float, peak: float | None, world_size: int = 1) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices used (recomputation
    by activation checkpointing is not counted: it is work, not model progress)."""
    if not peak:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)

"""What a run measures: device choice, synchronised clocks, peak memory, device peak FLOPS and MFU.

Names follow torchtitan's metrics: peak active memory, tokens/s, MFU, data-loading %.
"""
import json
import os
import platform
import re
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker

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

    def _update_peak_stats(self, peak_state) -> None:
        # Only the global peak is read (memory_breakdown). MemTracker also updates the peak of every active
        # module after every op, O(modules) per op: it made a tracked step of the cpu profile's 36-layer
        # model 4x slower than an untracked one, and the planner's estimates take minutes.
        for dev, snap in self._curr_mem_snap.items():
            if snap[_TOTAL_KEY] > self._peak_mem.get(dev, 0):
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        self.timeline.append(sum(snap[_TOTAL_KEY] for snap in self._curr_mem_snap.values()))
        return res


# The breakdown's parts, by their MemTracker names (the CUDA breakdown uses the same parts).
BREAKDOWN_PARTS = {"PARAM": "parameters", "BUFFER": "buffers", "GRAD": "gradients", "OPT": "optimizer_state",
             "ACT": "activations", "TEMP": "temporaries", "OTH": "other"}


def memory_breakdown(tracker: MemTracker) -> dict:
    """Peak snapshot of a tracker as {'parameters': MiB, ..., 'total': MiB}, summed over devices."""
    names = {**BREAKDOWN_PARTS, "Total": "total"}
    out = dict.fromkeys(names.values(), 0.0)
    for snap in tracker.get_tracker_snapshot("peak").values():
        for key, nbytes in snap.items():
            out[names[str(key).split(".")[-1]]] += nbytes / MiB
    return {k: round(v, 2) for k, v in out.items()}


# What the record's choices.memory_method can be, and what each means (the report prints these).
MEMORY_METHODS = {
    "memtracker": "MemTracker: peak live tensor storage during one training step: the last warm-up step, or one "
                  "extra step after timing when there is a single warm-up step (a compiled model runs eager "
                  "under the tracker)",
    "cuda_max_allocated": "torch.cuda.max_memory_allocated over the timed repeats (peak reset after warm-up)",
    "cuda_max_reserved": "torch.cuda.max_memory_reserved over the timed repeats, because CUDA graphs replay in a "
                         "private pool that max_memory_allocated does not see (an upper bound: it includes the "
                         "allocator's cached free blocks)",
}


def memory_method(device: torch.device, compile_mode: str | None) -> str:
    """How a run's peak memory is measured: a key of MEMORY_METHODS.

    CUDA graphs (compile mode "reduce-overhead") are recorded during warm-up into a private memory pool. A
    replay runs the recorded kernels on that pool's memory without asking the allocator, so what the graphs
    keep (activations, gradients, their scratch) is not counted by max_memory_allocated once warm-up is over,
    and a CUDA-graph stage would report a drop in memory that is not real. max_memory_reserved counts every
    segment the allocator holds from the device, the graph pool whole: what the stage takes from the GPU, and
    what decides an out-of-memory error. (The pool's size plus the eager peak would be tighter, but the blocks
    the pool hands out are also counted as allocated, and the sum is not a state the GPU was ever in.) Eager
    CUDA stages keep max_memory_allocated, as the reference measured; every CUDA record carries both figures,
    so the report can compare a CUDA-graph stage with its eager parent on the same one."""
    if device.type != "cuda":
        return "memtracker"
    return "cuda_max_reserved" if compile_mode == "reduce-overhead" else "cuda_max_allocated"


def release_cuda_cache(device: torch.device) -> None:
    """Return the allocator's unused cached segments to the device: after the first step, so that the reserved
    figure describes training, not what compilation and kernel autotuning cached."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_cuda_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def compile_cache_state() -> str | None:
    """Whether this process's torch.compile compiled its graphs ("cold"), loaded them all from the on-disk
    caches an earlier process filled (AOTAutograd's and Inductor's FX graph caches, on by default: "warm"),
    or some of each ("partly warm"); None before anything was compiled. A warm first step takes seconds
    where a cold one takes tens of seconds, so a compile time means little without this."""
    from torch._dynamo.utils import counters

    hits = counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
    misses = counters["aot_autograd"]["autograd_cache_miss"] + counters["inductor"]["fxgraph_cache_miss"]
    if not hits and not misses:
        return None
    return "cold" if not hits else "warm" if not misses else "partly warm"


def cuda_peaks_mib(device: torch.device) -> dict | None:
    """{'allocated': max_memory_allocated, 'reserved': max_memory_reserved}, MiB, since the last reset."""
    if device.type != "cuda":
        return None
    return {"allocated": torch.cuda.max_memory_allocated(device) / MiB,
            "reserved": torch.cuda.max_memory_reserved(device) / MiB}


# ----------------------------------------------------------------------------------------------------------
# one step recorded by the CUDA caching allocator (on the CPU, TimelineMemTracker does this job)
#
# torch.cuda.memory._record_memory_history makes the allocator log every allocation and free; _snapshot()
# returns that log ('device_traces') and the blocks alive at the end ('segments'): the pickle that
# pytorch.org/memory_viz opens. traced_step_memory derives the timeline and the breakdown at the peak from it.
# (This is the one place that reads the format for the ladder's own runs; a reader of the reference's
# snapshots for the memory planner is planned in gpt/memory, and the two should become one.)

MAX_TRACE_ENTRIES = 1_000_000  # the reference's GPT-2-large step traced 11,178 (3,726 allocations)


class StepMarks:
    """Where a traced step stands, counted in allocations since recording started (`count()` is the allocator's
    running number of allocations, which moves by one with every 'alloc' entry of the trace): the span of each
    forward pass, and which blocks hold parameters, buffers, optimizer state and, as the optimizer is about to
    step, the gradients. The hooks sit on the module train_step calls, outside any compiled region."""

    def __init__(self, model, optimizer, count):
        self.count, self.start = count, count()
        self.forward: list[list[int | None]] = []  # [start, end] positions of each forward pass
        self.tensors: list[tuple[int, int, str]] = []  # (position, storage address, category)
        self._hooks = [
            model.register_forward_pre_hook(self._forward_begins),
            model.register_forward_hook(self._forward_ends),
            optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: self.observe("gradients", [p.grad for g in opt.param_groups
                                                                     for p in g["params"]])),
        ]

    def position(self) -> int:
        return self.count() - self.start

    def _forward_begins(self, module, args):
        self.forward.append([self.position(), None])

    def _forward_ends(self, module, args, output):
        self.forward[-1][1] = self.position()

    def observe(self, category: str, tensors) -> None:
        now = self.position()
        for t in tensors:
            if isinstance(t, torch.Tensor):
                t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard (FSDP)
                if t.is_cuda:
                    self.tensors.append((now, t.untyped_storage().data_ptr(), category))

    def remove(self) -> None:
        for h in self._hooks:
            h.remove()


def cuda_step_memory(step, model, raw, optimizer, device: torch.device, path: Path | None = None) -> dict:
    """Run `step()` with the allocator recording its history; write the snapshot to `path` if given; return
    {'timeline_bytes': allocated bytes after every allocation and free, 'breakdown_mib': at the peak}."""
    count = lambda: torch.cuda.memory_stats(device)["allocation.all.allocated"]  # noqa: E731
    # Python stacks only: C++ frames make the snapshot slow to symbolise and large, and this code is Python.
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=MAX_TRACE_ENTRIES, clear_history=True)
    marks = StepMarks(model, optimizer, count)
    try:
        marks.observe("parameters", raw.parameters())
        marks.observe("buffers", raw.buffers())
        marks.observe("optimizer_state", [v for state in optimizer.state.values() for v in state.values()])
        step()
        synchronize(device)
        allocations = marks.position()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        marks.remove()
        torch.cuda.memory._record_memory_history(enabled=None)
    if path is not None:
        write_pickle(path, snapshot)
    timeline, breakdown = traced_step_memory(snapshot, device.index, marks.tensors, marks.forward)
    traced = sum(e["action"] == "alloc" for e in snapshot["device_traces"][device.index])
    if traced != allocations:  # the marks' positions only place them in a trace that holds every allocation
        print(f"warning: the allocator traced {traced} of the step's {allocations} allocations; the memory "
              "breakdown is left out", flush=True)
        breakdown = None
    return {"timeline_bytes": timeline, "breakdown_mib": breakdown}


def write_pickle(path: Path, obj) -> None:
    import pickle

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(obj, f)
    os.replace(tmp, path)


def traced_step_memory(snapshot: dict, device: int, tensors=(), forward=()) -> tuple[list[int], dict]:
    """From an allocator snapshot: (allocated bytes before the trace and after each of its allocations and
    frees, the breakdown at the peak in MiB with memory_breakdown's keys).

    What max_memory_allocated counts is blocks: a block alive at the end has its size in 'segments'; the trace
    only gives requested sizes, so a block freed within it counts as its request rounded up to the allocator's
    512 bytes (it may have been larger: a large block is not split for a rest under 1 MiB). A block stops
    counting at 'free_requested', when max_memory_allocated drops. The blocks before the trace are found by
    undoing it from the end; replayed forward, a block is known by its address and the number of the
    allocation that made it (0: made before the trace). At the peak, a block is what `tensors` says:
    (position, address, category) means the block at that address after `position` allocations held that
    category; otherwise it is an activation if a forward pass made it (start < number <= end for a
    [start, end] of `forward`), a temporary if the traced step made it elsewhere, and 'other' if it was there
    before (DDP's gradient buckets, cuBLAS workspaces)."""
    events = [e for e in snapshot["device_traces"][device] if e["action"] in ("alloc", "free_requested")]
    before = {b["address"]: b["size"] for s in snapshot["segments"] if s["device"] == device
              for b in s["blocks"] if b["state"] == "active_allocated"}
    sizes = {}  # index of an 'alloc' event -> the size of the block it made
    for i in range(len(events) - 1, -1, -1):
        e = events[i]
        if e["action"] == "alloc":
            sizes[i] = before.pop(e["addr"], _block_size(e["size"]))
        else:
            before[e["addr"]] = _block_size(e["size"])

    observed = {}
    for position, addr, category in tensors:
        observed.setdefault(position, []).append((addr, category))
    known = {}  # (address, allocation number) -> category

    def replay(until: int):
        """The blocks alive after `until` events (address -> (size, allocation number)), and the timeline."""
        blocks = {addr: (size, 0) for addr, size in before.items()}
        timeline, number = [sum(before.values())], 0
        for addr, category in observed.get(0, ()):
            known[(addr, 0)] = category
        for i, e in enumerate(events[:until]):
            if e["action"] == "alloc":
                number += 1
                blocks[e["addr"]] = (sizes[i], number)
                timeline.append(timeline[-1] + sizes[i])
                for addr, category in observed.get(number, ()):
                    if addr in blocks:
                        known[(addr, blocks[addr][1])] = category
            else:
                timeline.append(timeline[-1] - blocks.pop(e["addr"], (0, 0))[0])
        return blocks, timeline

    _, timeline = replay(len(events))
    peak_at = timeline.index(max(timeline))
    parts = dict.fromkeys(BREAKDOWN_PARTS.values(), 0)
    for addr, (size, number) in replay(peak_at)[0].items():
        category = known.get((addr, number))
        if category is None:
            in_forward = any(start < number <= end for start, end in forward if end is not None)
            category = "other" if number == 0 else "activations" if in_forward else "temporaries"
        parts[category] += size
    parts["total"] = timeline[peak_at]
    return timeline, {k: round(v / MiB, 2) for k, v in parts.items()}


def _block_size(requested: int) -> int:
    """CUDACachingAllocator's rounding of a request: at least 512 bytes, a multiple of 512."""
    return max(512, -(-requested // 512) * 512)


# ----------------------------------------------------------------------------------------------------------
# peak FLOPS and MFU

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
    "H100 HBM3": "H100 SXM", "H100 SXM5": "H100 SXM", "H100 NVL": "H100 NVL", "H100 PCIE": "H100 PCIe",
    "H200": "H200 SXM", "H200 NVL": "H200 NVL",
    "A100": "A100", "A100 SXM4": "A100", "A100 PCIE": "A100", "A10G": "A10G",
    "L40S": "L40S", "L40": "L40", "L4": "L4", "RTX 4090": "RTX 4090", "RTX 3090": "RTX 3090",
    "V100 SXM2": "V100 SXM2", "V100 PCIE": "V100 PCIe", "T4": "T4",
}


def gpu_board(name: str) -> str | None:
    """The GPU_PEAK_TFLOPS row of a CUDA device name, or None if the name is not one the table knows."""
    words = [w for w in re.split(r"[\s-]+", name.strip().upper())
             if w not in ("NVIDIA", "TESLA", "GEFORCE") and not re.fullmatch(r"\d+GB", w)]
    return GPU_NAMES.get(" ".join(words))


_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt-ladder" / "cpu_peak_flops.json"


def _read_cache() -> dict:
    try:
        return json.loads(_CACHE.read_text())
    except (OSError, ValueError):
        return {}


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
        return None, (f"no data-sheet peak for {name!r} in {dt} (add it to GPU_PEAK_TFLOPS and GPU_NAMES in "
                      "gpt/metrics.py)")
    return measure_cpu_matmul_flops(dtype), f"measured: {dt} matmul, {torch.get_num_threads()} thread(s)"


def fastest_peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The device's highest peak over the dtypes training can compute in: MFU against the peak of the dtype a
    stage uses can mislead (a CPU whose bf16 matmuls are slower than fp32 shows a high bf16 MFU while running
    slower), so the record also gives MFU against this one."""
    dtypes = (torch.float32, torch.bfloat16) + ((torch.float16,) if device.type == "cuda" else ())
    peaks = [(flops, source) for flops, source in (peak_flops(device, dt) for dt in dtypes) if flops]
    return max(peaks, key=lambda p: p[0]) if peaks else (None, "no known peak for this device")


def measure_cpu_matmul_flops(dtype: torch.dtype, n: int = 2048, seconds: float = 2.0, rounds: int = 1,
                             fresh: bool = False) -> float:
    """Best FLOP/s of an n x n matmul on this CPU with the current thread count, cached on disk
    (keyed by CPU model, threads, dtype and torch version) so every stage uses the same figure; `fresh`
    measures again and replaces the cached figure (run_all does so once, before its first stage).
    A VM's neighbours move the rate by 20% and more for seconds at a time, so `rounds` spreads the
    `seconds` over that many rounds, a second apart, and keeps the best.
    A dtype the CPU has no instructions for (bf16 on an AVX2-only CPU: ~1 GFLOP/s) would take a minute
    per 2048 x 2048 matmul: the size doubles from 256 only while one (warm) matmul takes under a quarter of
    a round, so such a dtype is measured on a smaller matrix (its rate is that low at every size)."""
    key = f"{_cpu_model()}|threads={torch.get_num_threads()}|{dtype}|torch={torch.__version__}|n={n}"
    cache = _read_cache()
    if key in cache and not fresh:
        return cache[key]
    best = matmul_rate(dtype, n, seconds, rounds)
    cache = _read_cache()  # another process may have written meanwhile
    cache[key] = best
    try:
        _CACHE.parent.mkdir(parents=True, exist_ok=True)
        tmp = _CACHE.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1))
        os.replace(tmp, _CACHE)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return best


def matmul_rate(dtype: torch.dtype, n: int = 2048, seconds: float = 2.0, rounds: int = 1) -> float:
    """The measurement behind measure_cpu_matmul_flops, uncached: best FLOP/s over `rounds` rounds."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    round_s = seconds / rounds
    with unset_fake_temporarily():  # real tensors even when called under FakeTensorMode (the memory planner)
        size = 256
        while size < n:
            a = torch.randn(size, size, dtype=dtype)
            a @ a  # the first call of a size pays for allocation and packing: time the second
            t0 = time.perf_counter()
            a @ a
            if 8 * (time.perf_counter() - t0) > round_s / 4:  # the next size takes 8x longer
                n = size
                break
            size *= 2
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


def calibrate_cpu_peaks(thread_counts: list[int], rounds: int = 5) -> dict[str, float]:
    """Measure afresh, on a quiet machine before any stage runs, every CPU peak the stages will read from
    the cache (fp32 and bf16 at each thread count the stages use), so that no stage's MFU rests on one
    2-second sample taken while the host was busy, nor on a figure cached on another day.
    Returns {"float32 x2 threads": FLOP/s, ...}."""
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
    """Model FLOPs utilisation: achieved model FLOP/s over the peak of all devices used (recomputation
    by activation checkpointing is not counted: it is work, not model progress)."""
    if not peak:
        return None
    return tokens_per_s * flops_per_token / (peak * world_size)

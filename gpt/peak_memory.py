"""How a run measures memory: its peak, and one instrumented step's memory-over-time curve and breakdown.

MemTracker on the CPU (gpt/timeline_tracker.py), the CUDA caching allocator's statistics and history on a GPU
(docs/measurement.md, peak memory).
"""

import math
from pathlib import Path

import torch

from gpt import allocator_snapshot
from gpt.allocator_snapshot import MiB
from gpt.devices import synchronize
from gpt.errors import UserError

TIMELINE_POINTS = 400  # a record's memory curve keeps at most about this many points (each window's maximum)


# ----------------------------------------------------------------------------------------------------------
# the peak, and how it is measured


# The parts of a memory breakdown (a record's memory_breakdown_mib, with 'total'), on the CPU and on CUDA alike,
# and their MemTracker names.
MEMORY_PARTS = ("parameters", "buffers", "gradients", "optimizer_state", "activations", "temporaries", "other")
_MEMTRACKER_NAMES = dict(zip(("PARAM", "BUFFER", "GRAD", "OPT", "ACT", "TEMP", "OTH"), MEMORY_PARTS))


def memory_breakdown(tracker) -> dict:
    """Peak snapshot of a tracker as {'parameters': MiB, ..., 'total': MiB}, summed over devices."""
    names = {**_MEMTRACKER_NAMES, "Total": "total"}
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

    CUDA graphs replay in a private pool that max_memory_allocated does not see, so a CUDA-graph stage gives the
    reservation; eager CUDA stages the allocated peak, as the reference measured (docs/measurement.md, peak memory)."""
    if device.type != "cuda":
        return "memtracker"
    return "cuda_max_reserved" if compile_mode == "reduce-overhead" else "cuda_max_allocated"


def release_cuda_cache(device: torch.device) -> None:
    """Return the allocator's unused cached segments to the device.

    Done after the first step, so that the reserved figure describes training, not what compilation and
    kernel autotuning cached."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def reset_cuda_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def cuda_peaks_mib(device: torch.device) -> dict | None:
    """{'allocated': max_memory_allocated, 'reserved': max_memory_reserved}, MiB, since the last reset."""
    if device.type != "cuda":
        return None
    return {
        "allocated": torch.cuda.max_memory_allocated(device) / MiB,
        "reserved": torch.cuda.max_memory_reserved(device) / MiB,
    }


# ----------------------------------------------------------------------------------------------------------
# one step under MemTracker (CPU)


def cpu_step_memory(step, model, optimizer) -> dict:
    """One training step under MemTracker: the breakdown at its peak and the memory-over-time curve (CPU).

    A compiled model runs this step eager, with dynamo kept away ("force_eager"): a frame it met under the tracker's
    dispatch mode would be marked "skip" for good, and every later step would run eager too."""
    from gpt.timeline_tracker import TimelineMemTracker  # here: importing MemTracker imports Dynamo (its module)

    tracker = TimelineMemTracker()
    tracker.track_external(model, optimizer)
    with torch.compiler.set_stance("force_eager"), tracker:
        tracker.reset_mod_stats()
        step()
    return {
        "breakdown_mib": memory_breakdown(tracker),
        "timeline_mib": downsample([b / MiB for b in tracker.timeline], TIMELINE_POINTS),
    }


def downsample(xs: list[float], n: int) -> list[float]:
    """At most ~n points, keeping each window's maximum so the peak survives."""
    if len(xs) <= n:
        return xs
    w = math.ceil(len(xs) / n)
    return [max(xs[i : i + w]) for i in range(0, len(xs), w)]


# ----------------------------------------------------------------------------------------------------------
# one step recorded by the CUDA caching allocator, read by gpt/allocator_snapshot.py with the step's own marks

MAX_TRACE_ENTRIES = 1_000_000  # the reference's GPT-2-large step traced 11,178 (3,726 allocations)


class StepMarks:
    """Where a traced step stands, counted in allocations since recording started (`count()`, the allocator's).

    The marks hold each forward pass's span, and which blocks hold parameters, buffers, optimizer state and, as the
    optimizer is about to step, gradients; the hooks sit on the module train_step calls, outside any compiled region."""

    def __init__(self, model, optimizer, count):
        self.count, self.start = count, count()
        self.forward: list[list[int | None]] = []  # [start, end] positions of each forward pass
        self.tensors: list[tuple[int, int, str]] = []  # (position, storage address, category)
        self._hooks = [
            model.register_forward_pre_hook(self._forward_begins),
            model.register_forward_hook(self._forward_ends),
            optimizer.register_step_pre_hook(
                lambda opt, args, kwargs: self.observe(
                    "gradients", [p.grad for g in opt.param_groups for p in g["params"]]
                )
            ),
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
    """Run `step()` with the allocator recording its history; write the snapshot to `path` if given.

    Returns breakdown_mib, timeline_mib and the snapshot's name. Not MemTracker, as on the CPU: dynamo does not compile
    under its dispatch mode, and it costs minutes at 36 layers."""
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
        allocator_snapshot.write(path, snapshot)
    try:
        traced = traced_memory(snapshot, device.index, marks.tensors, marks.forward)
    except UserError as e:  # the timed figures are measured already: never lose them for this
        print(f"warning: the allocator's record of the memory step is unreadable ({e})", flush=True)
        return {"breakdown_mib": None, "timeline_mib": None, "snapshot": path.name if path else None}
    breakdown = peak_breakdown(traced)
    if traced.allocations != allocations:  # the marks' positions only place them in a trace that holds them all
        print(
            f"warning: the allocator traced {traced.allocations} of the step's {allocations} allocations; the "
            "memory breakdown is left out",
            flush=True,
        )
        breakdown = None
    return {
        "breakdown_mib": breakdown,
        "timeline_mib": downsample([b / MiB for b in traced.timeline], TIMELINE_POINTS),
        "snapshot": path.name if path else None,
    }


def traced_memory(snapshot: dict, device: int, tensors=(), forward=()) -> allocator_snapshot.StepReport:
    """A traced step read with what the step itself saw: its allocated bytes over time and the blocks at its peak.

    What it saw comes from StepMarks: `tensors` as (position, address, category), `forward` as [start,
    end] positions. The bytes over time are its `timeline`."""
    labels = allocator_snapshot.StepLabels(list(tensors), list(forward), MEMORY_PARTS)
    return allocator_snapshot.analyse(snapshot, device, labels)


def peak_breakdown(traced: allocator_snapshot.StepReport) -> dict:
    """The record's memory_breakdown_mib of a traced step: whole blocks by part at the peak, and the total."""
    parts = {k: round(v, 2) for k, v in traced.peak_block_mib_by_category.items()}
    return {**parts, "total": round(traced.peak_mib, 2)}

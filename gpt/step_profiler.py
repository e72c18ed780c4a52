"""Where a step's time goes: labelled phases, a few profiled steps after the timed repeats, their trace, the breakdown.

`step_phase` labels a phase only while a profiler runs (the labels' cost: docs/design.md#the-figures-behind-the-rules).
Every instant of the profiled steps goes to exactly one category (`attribute`); the rules:
docs/measurement.md#where-the-time-goes.
"""

import bisect
import gzip
import json
import os
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

import torch

from gpt.devices import synchronize

PHASES = ("data", "copy", "forward", "backward", "optimizer")
TIME_CATEGORIES = (*PHASES, "communication", "gpu_idle", "other")  # display order
LABELS = {"data": "data wait", "gpu_idle": "GPU idle"}  # everything else is shown under its own name
PREFIX = "ladder/"
STEP = PREFIX + "step"  # one profiled step: the breakdown's window
WARMUP = PREFIX + "profiler_warmup"  # the step that lets CUPTI start up; in the trace, not in the breakdown
CUDA_WARMUP_STEPS = 1  # CUPTI initialises lazily in the first profiled kernels; on the CPU nothing to warm
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")  # GPU activities in a Kineto trace
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")  # host calls that launch them (cudaLaunchKernel, cuLaunchKernel, ...)
COLLECTIVE_THREAD_PREFIXES = ("gloo:",)  # a collective running on a backend's own thread (CPU)
COMPILED_REGION = "Torch-Compiled Region"  # the profiler's range around each call of a torch.compile'd graph
COMM_CALLS = ("c10d::", "nccl:", "gloo:", "FSDP::all_gather (", "FSDP::post_backward_reduce")  # on the host

_NULL = nullcontext()


def label(category: str) -> str:
    return LABELS.get(category, category)


def step_phase(phase: str):
    """A profiler range "ladder/<phase>" while a profiler runs, otherwise a shared no-op context."""
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(PREFIX + phase)
    return _NULL


def extra_steps(cfg, device: torch.device) -> int:
    """Steps the profiler adds after the timed repeats (the data sampler must provide them)."""
    if not cfg.profile_steps:
        return 0
    return cfg.profile_steps + (CUDA_WARMUP_STEPS if device.type == "cuda" else 0)


# ----------------------------------------------------------------------------------------------------------
# profiling a few steps


def profile_steps(step, cfg, device: torch.device, trace_path: Path | None, rank: int = 0) -> dict:
    """Run `cfg.profile_steps` more steps under torch.profiler (CPU, plus CUDA on a GPU; no shapes, stacks or memory).

    Returns the record's `time_breakdown_pct` and `profiler`, rank 0's (the others profile too, to stay in step), None
    when profiling is off; the trace (gzipped Chrome JSON) goes to `trace_path` when given."""
    none = {"time_breakdown_pct": None, "profiler": None}
    if not cfg.profile_steps:
        return none
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    warm = CUDA_WARMUP_STEPS if cuda else 0
    total = warm + cfg.profile_steps
    synchronize(device)
    with torch.profiler.profile(activities=activities) as prof:
        for i in range(total):
            with torch.profiler.record_function(STEP if i >= warm else WARMUP):
                step()
                if i == total - 1:
                    synchronize(device)  # the last step's window ends when its GPU work does
    if rank != 0:
        return none
    try:
        facts = _export_and_measure(prof, trace_path, cfg.profile_steps)
    except Exception as e:  # noqa: BLE001 - the timed figures are measured already; never lose them for this
        print(f"warning: the profiled steps gave no breakdown ({type(e).__name__}: {e})", file=sys.stderr)
        return none
    return {"time_breakdown_pct": facts.pop("shares_pct"), "profiler": {**facts, "rank": rank}}


def _export_and_measure(prof, trace_path: Path | None, steps: int) -> dict:
    if trace_path:
        trace_path.parent.mkdir(parents=True, exist_ok=True)  # the record's directory, written after this
    with tempfile.TemporaryDirectory(dir=trace_path.parent if trace_path else None) as tmp:
        exported = os.path.join(tmp, "trace.json.gz")
        prof.export_chrome_trace(exported)  # .gz: written compressed
        result = breakdown(read_trace(exported))
        if result["steps"] != steps:
            raise ValueError(f"found {result['steps']} profiled steps in the trace, expected {steps}")
        if trace_path:
            os.replace(exported, trace_path)  # atomic, like the record beside it
        result["trace"] = trace_path.name if trace_path else None
    return result


def read_trace(path) -> list[dict]:
    with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


# ----------------------------------------------------------------------------------------------------------
# interval arithmetic: sorted lists of disjoint (start, end) pairs


def union(intervals) -> list[tuple[float, float]]:
    out = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def intersect(a: list, b: list) -> list[tuple[float, float]]:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list, b: list) -> list[tuple[float, float]]:
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > s:
                out.append((s, b[k][0]))
            s = max(s, b[k][1])
            k += 1
        if s < e:
            out.append((s, e))
    return out


def length(a: list) -> float:
    return sum(e - s for s, e in a)


def attribute(windows: list, layers: list[tuple[str, list]], rest: str) -> dict[str, float]:
    """Split the time of `windows` among categories: each (category, intervals) layer, in order, takes what it covers.

    What no layer covers goes to `rest`; a category may appear in several layers; the parts add up to the windows
    exactly."""
    left = union(windows)
    out = {}
    for category, intervals in layers:
        taken = intersect(left, union(intervals))
        out[category] = out.get(category, 0.0) + length(taken)
        left = subtract(left, taken)
    out[rest] = out.get(rest, 0.0) + length(left)
    return out


# ----------------------------------------------------------------------------------------------------------
# from a Kineto (Chrome) trace to the breakdown


def _span(e: dict) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))


def breakdown(events: list[dict]) -> dict:
    """The time breakdown of the profiled steps (the "ladder/step" ranges) of a trace.

    {"shares_pct": {category: % of wall time, adding up to 100}, "steps", "step_s",
     "gpu_idle_pct": % of wall time with no GPU activity at all (CUDA; None on the CPU)}."""
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e]
    # the host's ranges ("user_annotation"; on CUDA Kineto repeats them on the GPU's timeline as "gpu_user_annotation")
    steps = [e for e in spans if e.get("name") == STEP and e.get("cat") == "user_annotation"]
    if not steps:
        raise ValueError(f"no {STEP!r} ranges in the trace")
    main = (steps[0].get("pid"), steps[0].get("tid"))  # the training thread
    windows = union(_span(e) for e in steps)
    on_main = [e for e in spans if (e.get("pid"), e.get("tid")) == main]
    phases = {p: [_span(e) for e in on_main if e.get("name") == PREFIX + p] for p in PHASES}
    comm_calls = [_span(e) for e in on_main if str(e.get("name", "")).startswith(COMM_CALLS)]
    device = [e for e in spans if e.get("cat") in DEVICE_CATS]

    if device:
        seconds = _attribute_cuda(windows, phases, comm_calls, device, spans)
        busy = union(_span(e) for e in device)
        idle_pct = 100 * (1 - length(intersect(windows, busy)) / length(windows))
    else:
        ours = {STEP, WARMUP, *(PREFIX + p for p in PHASES)}
        ops = [_span(e) for e in on_main if e.get("name") not in ours]  # anything the thread was inside
        in_flight = [
            _span(e)
            for e in spans
            if (e.get("pid") == main[0])
            and (e.get("pid"), e.get("tid")) != main
            and str(e.get("name", "")).startswith(COLLECTIVE_THREAD_PREFIXES)
        ]
        seconds = attribute(
            windows,
            [
                ("communication", comm_calls),
                ("communication", subtract(union(in_flight), union(ops))),  # waited: nothing else ran
                *((p, phases[p]) for p in PHASES),
            ],
            rest="other",
        )
        idle_pct = None
    total = length(windows)
    # torch.compile's graphs announce themselves in the trace: a compiled stage whose steps show none ran eager
    compiled = [
        e
        for e in on_main
        if str(e.get("name", "")).startswith(COMPILED_REGION) and length(intersect(windows, [_span(e)])) > 0
    ]
    return {
        "shares_pct": {c: 100 * seconds.get(c, 0.0) / total for c in TIME_CATEGORIES if c != "gpu_idle" or device},
        "steps": len(steps),
        "compiled_regions_per_step": len(compiled) / len(steps),
        "step_s": total / len(steps) / 1e6,  # trace timestamps are in microseconds
        "gpu_idle_pct": idle_pct,
    }


def _attribute_cuda(windows, phases: dict, comm_calls: list, device: list[dict], spans: list[dict]) -> dict:
    """GPU activity by the phase that launched it; GPU idle time by what the host was doing."""
    launches = {}  # correlation id -> launch time on the host
    for e in spans:
        if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = float(e["ts"])
    bounds = sorted((s, e, p) for p, intervals in phases.items() for s, e in intervals)
    starts = [b[0] for b in bounds]

    def launched_in(event: dict) -> str:
        t = launches.get(event.get("args", {}).get("correlation"))
        if t is None:
            return "other"
        i = bisect.bisect_right(starts, t) - 1  # phases do not overlap on the training thread
        return bounds[i][2] if i >= 0 and t <= bounds[i][1] else "other"

    kernels = {c: [] for c in (*PHASES, "other", "communication")}
    for e in device:
        category = "communication" if str(e.get("name", "")).startswith("nccl") else launched_in(e)
        kernels[category].append(_span(e))
    compute = [p for p in PHASES if p != "copy"]
    return attribute(
        windows,
        [
            *((c, kernels[c]) for c in (*compute, "other")),  # computing
            ("copy", kernels["copy"]),  # copying, with no kernel beside it
            ("communication", kernels["communication"]),  # exposed communication
            ("communication", comm_calls),  # GPU idle from here on: what kept the host
            ("data", phases["data"]),
            ("copy", phases["copy"]),
        ],
        rest="gpu_idle",
    )

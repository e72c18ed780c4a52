"""The measurement protocol: how one stage's training run becomes its record.

`measure` is the protocol, phase by phase (prepare, warm_up, timed_repeats, profile_steps, memory_step, across_ranks,
record); what each does and measures: docs/measurement.md. Under DDP/FSDP every rank runs the protocol; no `.item()`
and no synchronisation happen inside a timed repeat.
"""

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from gpt import distributed, train  # train.build_model, train.train_step: tests instrument them there
from gpt.clocks import FeedClock, StepClock, beyond_steady
from gpt.config import TrainConfig
from gpt.devices import device_name, resolve_device, synchronize
from gpt.flops import fastest_peak_flops, mfu, peak_flops
from gpt.optimizations import parallel
from gpt.optimizations.compilation import startup_steps
from gpt.peak_memory import cpu_step_memory, cuda_peaks_mib, cuda_step_memory, release_cuda_cache, reset_cuda_peak
from gpt.records import SCHEMA_VERSION, environment
from gpt.step_profiler import extra_steps, profile_steps


def run(
    cfg: TrainConfig, label: str = "train", memory_snapshot: Path | None = None, trace_path: Path | None = None
) -> dict:
    """Train `cfg` under the measurement protocol and return the run's record (docs/records.md#the-json-record).

    On CUDA, rank 0 writes the instrumented step's allocator snapshot to `memory_snapshot`, and with
    `cfg.profile_steps` the profiler's trace to `trace_path` (each if given)."""
    device = resolve_device(cfg.device)
    with distributed.process_group(device, parallel.backend(cfg, device)):  # a failed rank leaves at once
        return measure(cfg, device, label, memory_snapshot, trace_path)


def measure(
    cfg: TrainConfig,
    device: torch.device,
    label: str,
    snapshot_path: Path | None = None,
    trace_path: Path | None = None,
) -> dict:
    """The protocol (this module's docstring), in one process of the run."""
    memory_in_warmup = cfg.measure_memory and device.type != "cuda" and cfg.warmup_iters >= 2
    trainer = prepare(cfg, device, label, memory_in_warmup)
    warm = warm_up(trainer, memory_in_warmup)
    timed = timed_repeats(trainer)
    profiled = profile_steps(trainer.step, cfg, device, trace_path, trainer.rank)  # after timing: no effect on it
    memory = warm.memory if memory_in_warmup else memory_step(trainer, snapshot_path)
    trainer.progress.close()
    timed = across_ranks(trainer, timed, peak_memory(trainer, timed, memory))
    return record(trainer, label, warm, timed, profiled, memory)


# ----------------------------------------------------------------------------------------------------------
# the phases


def prepare(cfg: TrainConfig, device: torch.device, label: str, memory_in_warmup: bool) -> train.Trainer:
    """The stage's trainer (gpt/train.py), its sampler drawing exactly the batches every phase will take."""
    steps = (
        cfg.warmup_iters
        + cfg.repeats * cfg.steps_per_repeat
        + extra_steps(cfg, device)
        + int(cfg.measure_memory and not memory_in_warmup)
    )
    return train.prepare(cfg, device, steps, label)


@dataclass
class WarmUp:
    seconds: float
    first_step_s: float | None = None  # includes torch.compile's compilation
    startup_steps_s: list[float] = field(default_factory=list)  # the start-up steps' seconds, each timed on its own
    first_loss: float | None = None
    compile_cache: str | None = None  # compile_cache_state after the first step
    memory: dict = field(default_factory=dict)  # the CPU's memory step, when it was the last warm-up step
    cuda_peaks: dict | None = None  # the allocator's peaks over the warm-up steps after the first (CUDA): CUDA
    # graphs record their pool then (cudagraph trees run a graph once unrecorded, then record it)


def warm_up(trainer: train.Trainer, memory_in_warmup: bool) -> WarmUp:
    """`warmup_iters` steps: compilation, CUDA graphs' recording and DataLoader worker start-up happen here.

    The start-up steps are timed each on its own (compile_s: what they took beyond a steady step). After the first, the
    allocator's cache is released, so the reserved figure describes training. On the CPU the last warm-up step, when not
    the first (whose optimizer state is only born in its update), is the memory step."""
    cfg, device = trainer.cfg, trainer.device
    trainer.model.train()
    forget_compilations()
    synchronize(device)
    t0 = time.perf_counter()
    warm = WarmUp(seconds=0.0)
    startup = min(startup_steps(trainer.cuda_graphs), cfg.warmup_iters - memory_in_warmup)
    for i in range(cfg.warmup_iters):
        if memory_in_warmup and i == cfg.warmup_iters - 1:
            warm.memory = cpu_step_memory(trainer.step, trainer.model, trainer.optimizer)
            continue
        step_t0 = time.perf_counter()  # after the previous start-up step's synchronisation
        loss = trainer.step()
        if i < startup:
            synchronize(device)
            warm.startup_steps_s.append(time.perf_counter() - step_t0)
        if i == 0:
            warm.first_step_s, warm.first_loss = warm.startup_steps_s[0], loss.item()
            warm.compile_cache = compile_cache_state() if trainer.choices.compile_mode else None
            release_cuda_cache(device)
            reset_cuda_peak(device)  # warm.cuda_peaks: the steps after compilation's own transients
    synchronize(device)
    warm.seconds = time.perf_counter() - t0
    if cfg.warmup_iters >= 2:  # with one warm-up step the graphs are recorded in the timed repeats instead
        warm.cuda_peaks = cuda_peaks_mib(device)
    return warm


_CACHE_COUNTERS = (
    ("aot_autograd", "autograd_cache_hit"),
    ("inductor", "fxgraph_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
    ("inductor", "fxgraph_cache_miss"),
)


def forget_compilations() -> None:
    """Start compile_cache_state's count afresh before the model's first step: what compiled before is not the model."""
    from torch._dynamo.utils import counters

    for group, name in _CACHE_COUNTERS:
        counters[group].pop(name, None)


def compile_cache_state() -> str | None:
    """Whether torch.compile compiled this process's graphs ("cold"), loaded them ("warm") or some of each (None: none).

    Loaded from the on-disk caches an earlier process filled (AOTAutograd's, Inductor's): docs/measurement.md."""
    from torch._dynamo.utils import counters

    hits = counters["aot_autograd"]["autograd_cache_hit"] + counters["inductor"]["fxgraph_cache_hit"]
    misses = counters["aot_autograd"]["autograd_cache_miss"] + counters["inductor"]["fxgraph_cache_miss"]
    if not hits and not misses:
        return None
    return "cold" if not hits else "warm" if not misses else "partly warm"


@dataclass
class Timed:
    repeat_s: list[float]  # seconds of each repeat of N samples
    step_s: list[float]  # every timed step's duration (CUDA events on a GPU)
    losses: list[float]  # every timed step's loss
    waits: list[float]  # host seconds waiting for each batch
    copies: list[float]  # seconds of each host-to-device copy
    cuda_peaks: dict | None  # max_memory_allocated and max_memory_reserved over the repeats, MiB (CUDA)
    peak_mib: float | None = None  # the peak the record reports (peak_memory)


def timed_repeats(trainer: train.Trainer) -> Timed:
    """`repeats` times "train on N samples" between two device synchronisations, timed with the host clock.

    Inside a repeat no `.item()` and no synchronisation: per-step times come from CUDA events (the host clock
    on the CPU), losses are read after the repeat. Under DDP/FSDP the ranks start each repeat together."""
    cfg, device = trainer.cfg, trainer.device
    reset_cuda_peak(device)
    repeat_s, step_s, losses, feed = [], [], [], FeedClock(device)
    for _ in range(cfg.repeats):
        if cfg.world_size > 1:
            dist.barrier()  # start together, so a repeat measures the ranks' joint work
        clock = StepClock(device)
        synchronize(device)
        t0 = time.perf_counter()
        rep_losses = trainer.run(cfg.steps_per_repeat, feed, mark=clock.mark)
        synchronize(device)
        repeat_s.append(time.perf_counter() - t0)
        step_s += clock.durations()
        losses += torch.stack(rep_losses).float().tolist()  # after the clock stopped
    return Timed(repeat_s, step_s, losses, feed.data_s, feed.copy_s(), cuda_peaks_mib(device))


def memory_step(trainer: train.Trainer, snapshot_path: Path | None) -> dict:
    """One extra, instrumented step after timing (gpt/peak_memory.py); {} when memory is not measured.

    A CUDA-graph stage's step is a replay in the graphs' private pool, which the allocator's history does not see
    (docs/measurement.md, peak memory): it records no breakdown and no curve, only the snapshot."""
    if not trainer.cfg.measure_memory:
        return {}
    if trainer.device.type == "cuda":
        path = Path(snapshot_path) if snapshot_path and trainer.rank == 0 else None
        memory = cuda_step_memory(trainer.step, trainer.model, trainer.gpt, trainer.optimizer, trainer.device, path)
        return {**memory, "breakdown_mib": None, "timeline_mib": None} if trainer.cuda_graphs else memory
    return cpu_step_memory(trainer.step, trainer.model, trainer.optimizer)


def peak_memory(trainer: train.Trainer, timed: Timed, memory: dict) -> float | None:
    """The record's peak: the allocator's over the timed repeats on CUDA (memory_method's), else the memory step's."""
    if timed.cuda_peaks:
        method = trainer.choices.memory_method
        return timed.cuda_peaks["reserved" if method == "cuda_max_reserved" else "allocated"]
    return memory["breakdown_mib"]["total"] if memory else None


def across_ranks(trainer: train.Trainer, timed: Timed, peak_mib: float | None) -> Timed:
    """The figures the record gives for the whole run.

    One process: its own. DDP/FSDP: a repeat lasts as long as its slowest rank; losses are the ranks'
    mean; data waits, copies and peaks the largest rank's."""
    world, device = trainer.cfg.world_size, trainer.device
    if world == 1:
        timed.peak_mib = peak_mib
        return timed
    peaks = timed.cuda_peaks
    return Timed(
        repeat_s=_all_reduce(timed.repeat_s, device, dist.ReduceOp.MAX),
        step_s=timed.step_s,
        losses=_all_reduce(timed.losses, device, dist.ReduceOp.SUM, scale=1 / world),
        waits=_all_reduce(timed.waits, device, dist.ReduceOp.MAX),
        copies=_all_reduce(timed.copies, device, dist.ReduceOp.MAX),
        peak_mib=_all_reduce([peak_mib or 0.0], device, dist.ReduceOp.MAX)[0],
        cuda_peaks=dict(zip(peaks, _all_reduce(list(peaks.values()), device, dist.ReduceOp.MAX))) if peaks else None,
    )


def _all_reduce(values: list[float], device: torch.device, op, scale: float = 1.0) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(t, op=op)
    return (t * scale).tolist()


# ----------------------------------------------------------------------------------------------------------
# the record


def record(trainer: train.Trainer, label: str, warm: WarmUp, timed: Timed, profiled: dict, memory: dict) -> dict:
    """The run's JSON record (README: The JSON record); the ladder adds the stage's place in its ladder."""
    return {
        **run_facts(trainer, label),
        "metrics": {
            **time_metrics(trainer, warm, timed),
            **profiled,
            **memory_metrics(warm, timed, memory),
            **flops_metrics(trainer, timed),
            **loss_metrics(trainer.cfg, warm, timed),
        },
    }


def run_facts(trainer: train.Trainer, label: str) -> dict:
    """What every record of a finished run holds besides its metrics.

    The settings, the model, the device, the choices made on it and the provenance (the timed protocol's
    records and those of training to a loss)."""
    raw, cfg, device = trainer.gpt, trainer.cfg, trainer.device
    return {
        "schema": SCHEMA_VERSION,
        "status": "ok",
        "label": label,
        "config": cfg.to_dict(),
        "model": {**asdict(raw.config), "params": raw.num_params(), "flops_per_token": raw.flops_per_token()},
        "device": {
            "type": device.type,
            "name": device_name(device),
            "count": cfg.world_size,
            "threads_per_process": torch.get_num_threads(),
        },
        "choices": trainer.choices.record(),
        "env": environment(),
    }


def time_metrics(trainer: train.Trainer, warm: WarmUp, timed: Timed) -> dict:
    cfg = trainer.cfg
    mean_s = statistics.fmean(timed.repeat_s)
    steady = statistics.median(timed.step_s)
    return {
        "seconds_mean": mean_s,
        "seconds_std": statistics.stdev(timed.repeat_s) if len(timed.repeat_s) > 1 else 0.0,
        "seconds_per_repeat": timed.repeat_s,
        "samples_per_repeat": cfg.samples,
        "steps_per_repeat": cfg.steps_per_repeat,
        "tokens_per_s": tokens_per_s(cfg, timed),
        "step_time_s": mean_s / cfg.steps_per_repeat,
        "step_time_median_s": steady,
        "step_times_s": timed.step_s,
        "first_step_s": warm.first_step_s,
        "warmup_s": warm.seconds,
        # compilation happens in the first step, CUDA graphs' recording in the next: what they add is its cost
        "compile_s": sum(beyond_steady(warm.startup_steps_s, steady))
        if trainer.choices.compile_mode and warm.startup_steps_s
        else None,
        "compile_cache": warm.compile_cache,
        "data_wait_pct": 100 * sum(timed.waits) / sum(timed.repeat_s),
        "copy_pct": 100 * sum(timed.copies) / sum(timed.repeat_s),
    }


def tokens_per_s(cfg: TrainConfig, timed: Timed) -> float:
    return cfg.samples * cfg.block_size / statistics.fmean(timed.repeat_s)


def memory_metrics(warm: WarmUp, timed: Timed, memory: dict) -> dict:
    cuda_peaks = timed.cuda_peaks or {}
    return {
        "peak_memory_mib": timed.peak_mib,
        "peak_memory_allocated_mib": cuda_peaks.get("allocated"),
        "peak_memory_reserved_mib": cuda_peaks.get("reserved"),
        # CUDA graphs allocate their pool while warm-up records them, and replays allocate nothing: this peak holds
        # the pool, which the timed repeats' allocated peak does not (gpt/memory's compare reads it)
        "peak_memory_warmup_allocated_mib": (warm.cuda_peaks or {}).get("allocated"),
        "memory_breakdown_mib": memory.get("breakdown_mib"),
        "memory_timeline_mib": memory.get("timeline_mib"),
        "memory_snapshot": memory.get("snapshot"),
    }


def flops_metrics(trainer: train.Trainer, timed: Timed) -> dict:
    """MFU against the peak of the dtype the run computes in, and against the device's fastest.

    The dtype the run computes in is autocast's or FSDP's mixed precision's."""
    device, world, per_token = trainer.device, trainer.cfg.world_size, trainer.gpt.flops_per_token()
    flops, flops_source = peak_flops(device, trainer.choices.compute_dtype)
    best_flops, best_source = fastest_peak_flops(device)
    rate = tokens_per_s(trainer.cfg, timed)
    return {
        "flops_per_token": per_token,
        "peak_flops_per_device": flops,
        "peak_flops_source": flops_source,
        "mfu_pct": _pct(mfu(rate, per_token, flops, world)),
        "peak_flops_fastest": best_flops,
        "peak_flops_fastest_source": best_source,
        "mfu_fastest_pct": _pct(mfu(rate, per_token, best_flops, world)),
    }


def loss_metrics(cfg: TrainConfig, warm: WarmUp, timed: Timed) -> dict:
    return {
        "loss_first": warm.first_loss,
        "loss_final": statistics.fmean(timed.losses[-cfg.steps_per_repeat :]),
        "losses": timed.losses,
    }


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x

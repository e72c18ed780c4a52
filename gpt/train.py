"""One training loop for every stage of every ladder, and the measurement protocol around it.

Protocol (the reference's): `warmup_iters` optimizer steps (the first one, which includes torch.compile's
compilation, is timed on its own), then `repeats` times "train on N samples" between two device
synchronisations. Under DDP/FSDP each of the W ranks trains on N/W samples and a repeat lasts as long as
the slowest rank. No `.item()` and no synchronisation inside a timed repeat: losses stay on the device
until the repeat ends. Peak memory: on CUDA `max_memory_allocated` over the timed repeats (peak reset
after warm-up), or `max_memory_reserved` for CUDA graphs (gpt/metrics.py:memory_method says why); on the
CPU, MemTracker's peak of live tensor memory over the last warm-up step (or, with a single warm-up step,
one extra step after timing). That step also gives the memory timeline and breakdown: MemTracker's on the
CPU, the CUDA allocator's own history of one extra step on CUDA.
Where the time goes: `profile_steps` more steps under torch.profiler after the timed repeats, before the
extra memory step (gpt/profiling.py).
"""
import math
import statistics
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from gpt import chunked_loss, distributed
from gpt.config import TrainConfig
from gpt.data import WindowSampler, make_dataset
from gpt.metrics import (
    FeedClock,
    StepClock,
    TimelineMemTracker,
    compile_cache_state,
    cuda_peaks_mib,
    cuda_step_memory,
    device_name,
    memory_breakdown,
    fastest_peak_flops,
    memory_method,
    mfu,
    peak_flops,
    release_cuda_cache,
    reset_cuda_peak,
    resolve_device,
    synchronize,
)
from gpt.model import GPT, GPTConfig
from gpt.optimizations import (
    checkpoint_blocks,
    compile_mode,
    compile_model,
    make_loader,
    make_optimizer,
    matmul_precision,
    mixed_precision,
    parallelize,
    to_device,
)
from gpt.profiling import extra_steps, profile_steps, region
from gpt.records import SCHEMA_VERSION, environment

MiB = 2**20


def build_model(cfg: TrainConfig, vocab_size: int, device: torch.device):
    """The model with the ladder's model-side optimizations applied, in the order they compose:
    checkpoint the blocks, then shard/replicate them, then build the optimizer over the final (possibly
    sharded) parameters, then compile the whole.

    Every rank builds identical weights from the same seed (FSDP does not broadcast them); then each rank
    reseeds with its rank added, so that ranks draw different dropout masks, as one process would for the
    different samples of one batch. Rank 0 (or the one process) draws the masks of seed + 0."""
    torch.manual_seed(cfg.seed)
    overrides = {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd") if getattr(cfg, k) is not None}
    loss_impl = chunked_loss.resolve(cfg.loss_impl, device.type) if cfg.loss == "chunked" else cfg.loss_impl
    model_cfg = GPTConfig.from_preset(cfg.preset, vocab_size=vocab_size, block_size=cfg.block_size,
                                      dropout=cfg.dropout, attention=cfg.attention, loss=cfg.loss,
                                      loss_impl=loss_impl, vocab_multiple=cfg.vocab_multiple, **overrides)
    raw = GPT(model_cfg)
    if device.type != "cpu":  # built on the CPU already: skipping the no-op move lets gpt/memory build
        raw = raw.to(device)  # under FakeTensorMode, whose fake parameters refuse Module.to's swap
    model = checkpoint_blocks(raw, cfg)
    model = parallelize(model, cfg, device)
    optimizer = make_optimizer(model, cfg)
    model = compile_model(model, cfg, device)
    torch.manual_seed(cfg.seed + distributed.rank())
    return raw, model, optimizer


def _grad_sync(model, last_micro_batch: bool):
    """DDP all-reduces gradients in every backward; with accumulation only the last micro-batch needs it.
    (FSDP reduce-scatters every micro-batch: keeping unsharded gradients would cost the memory FSDP saves.)"""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, torch.nn.parallel.DistributedDataParallel) and not last_micro_batch:
        return inner.no_sync()
    return torch.enable_grad()


def train_step(model, optimizer, x, y, cfg: TrainConfig, amp) -> torch.Tensor:
    """One optimizer step on a batch of `cfg.batch_size` samples; returns the batch's mean loss (on device).

    Gradient accumulation: the batch is split into `grad_accum_steps` micro-batches; each micro-batch
    loss is divided by their number, so the summed gradients are the gradient of the mean loss over the
    whole batch: the same update, with the activations of one micro-batch alive at a time."""
    k = cfg.grad_accum_steps
    total = torch.zeros((), device=x.device)
    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k))):
        with _grad_sync(model, last_micro_batch=i == k - 1):
            with region("forward"):
                with amp.autocast():
                    _, loss = model(xm, ym)
                loss = loss / k
            with region("backward"):
                (amp.scaler.scale(loss) if amp.scaler else loss).backward()
        total += loss.detach()
    with region("optimizer"):
        if amp.scaler:
            amp.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if amp.scaler:
            amp.scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
            amp.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total


def run(cfg: TrainConfig, label: str = "train", memory_snapshot: Path | None = None,
        trace_path: Path | None = None) -> dict:
    """Train under the measurement protocol and return the run's record (see README: The JSON record).
    On CUDA, rank 0 writes the allocator's snapshot of the instrumented step to `memory_snapshot`, and with
    `cfg.profile_steps` the profiler's trace to `trace_path` (each if given)."""
    cfg.validate()
    device = resolve_device(cfg.device)
    with distributed.process_group(device, enabled=bool(cfg.distributed)):  # a failed rank leaves at once
        return _measure(cfg, device, label, memory_snapshot, trace_path)


def _measure(cfg: TrainConfig, device: torch.device, label: str, snapshot_path: Path | None = None,
             trace_path: Path | None = None) -> dict:
    world, rank = cfg.world_size, distributed.rank()
    dataset = make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size)
    raw, model, optimizer = build_model(cfg, dataset.vocab_size, device)
    amp = mixed_precision(cfg, device)
    fp32_matmuls = matmul_precision(cfg, device)
    cuda_graphs = compile_mode(cfg, device) == "reduce-overhead"
    method = memory_method(device, compile_mode(cfg, device))

    # CPU: the last warm-up step, when it is not the first (whose optimizer state is only born in its
    # update), is the memory step: one step fewer per stage than an extra one after timing
    track_in_warmup = cfg.measure_memory and device.type != "cuda" and cfg.warmup_iters >= 2
    total_steps = (cfg.warmup_iters + cfg.repeats * cfg.steps_per_repeat + extra_steps(cfg, device)
                   + int(cfg.measure_memory and not track_in_warmup))
    sampler = WindowSampler(len(dataset), cfg.batch_size, total_steps, cfg.seed, rank, world)
    batches = iter(make_loader(dataset, sampler, cfg, device))
    progress = tqdm(total=total_steps, desc=label, unit="step", disable=rank != 0, dynamic_ncols=True)

    def step(feed: FeedClock | None = None):
        """One step; returns the loss (on device). `feed` times the data wait and the copy."""
        feed = feed or FeedClock(device)
        with feed.data():
            batch = next(batches)
        with feed.copy():
            x, y = to_device(batch, device, cfg)
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be reused
        loss = train_step(model, optimizer, x, y, cfg, amp)
        progress.update()
        return loss.clone() if cuda_graphs else loss

    # ---- warm-up (includes compilation and DataLoader worker start-up) ----
    model.train()
    synchronize(device)
    t0 = time.perf_counter()
    first_loss, first_step_s, compile_cache, memory = None, None, None, {}
    for i in range(cfg.warmup_iters):
        if track_in_warmup and i == cfg.warmup_iters - 1:
            memory = tracked_step_memory(step, model, optimizer)
            continue
        loss = step()
        if i == 0:
            synchronize(device)
            first_step_s, first_loss = time.perf_counter() - t0, loss.item()
            compile_cache = compile_cache_state() if cfg.compile else None
            release_cuda_cache(device)
    synchronize(device)
    warmup_s = time.perf_counter() - t0

    # ---- timed repeats ----
    reset_cuda_peak(device)
    repeat_s, step_s, losses, feed = [], [], [], FeedClock(device)
    for _ in range(cfg.repeats):
        if world > 1:
            dist.barrier()  # start together, so a repeat measures the ranks' joint work
        clock, rep_losses = StepClock(device), []
        synchronize(device)
        t0 = time.perf_counter()
        for _ in range(cfg.steps_per_repeat):
            clock.mark()
            rep_losses.append(step(feed))
        clock.mark()
        synchronize(device)
        repeat_s.append(time.perf_counter() - t0)
        step_s += clock.durations()
        losses += torch.stack(rep_losses).float().tolist()  # after the clock stopped
    cuda_peaks = cuda_peaks_mib(device)
    waits, copies = feed.data_s, feed.copy_s()  # after the last synchronize

    # ---- where the time goes: a few profiled steps, after timing so that they never change it ----
    profiled = profile_steps(step, cfg, device, trace_path, rank)  # time_breakdown_pct and profiler

    # ---- memory: one extra, instrumented step (unless a warm-up step was that step) ----
    if cfg.measure_memory and device.type == "cuda":
        # The allocator's own history: MemTracker would not do here, since dynamo does not compile under its
        # dispatch mode (it would describe an eager step) and it costs minutes at 36 layers.
        path = Path(snapshot_path) if snapshot_path and rank == 0 else None
        traced = cuda_step_memory(step, model, raw, optimizer, device, path)
        memory = {"breakdown_mib": traced["breakdown_mib"],
                  "timeline_mib": _downsample([b / MiB for b in traced["timeline_bytes"]], 400),
                  "snapshot": path.name if path else None}
    elif cfg.measure_memory and not track_in_warmup:
        memory = tracked_step_memory(step, model, optimizer)
    progress.close()
    if cuda_peaks:
        peak_mib = cuda_peaks["reserved" if method == "cuda_max_reserved" else "allocated"]
    else:
        peak_mib = memory["breakdown_mib"]["total"] if memory else None

    if world > 1:  # a repeat lasts as long as its slowest rank; report rank-averaged losses and peaks
        repeat_s = _all_reduce(repeat_s, device, dist.ReduceOp.MAX)
        losses = _all_reduce(losses, device, dist.ReduceOp.SUM, scale=1 / world)
        waits = _all_reduce(waits, device, dist.ReduceOp.MAX)
        copies = _all_reduce(copies, device, dist.ReduceOp.MAX)
        peak_mib = _all_reduce([peak_mib or 0.0], device, dist.ReduceOp.MAX)[0]
        if cuda_peaks:
            cuda_peaks = dict(zip(cuda_peaks, _all_reduce(list(cuda_peaks.values()), device, dist.ReduceOp.MAX)))

    mean_s = statistics.fmean(repeat_s)
    tokens_per_s = cfg.samples * cfg.block_size / mean_s
    flops, flops_source = peak_flops(device, amp.dtype)
    best_flops, best_source = fastest_peak_flops(device)
    steady = statistics.median(step_s)
    return {
        "schema": SCHEMA_VERSION,
        "status": "ok",
        "label": label,
        "config": cfg.to_dict(),
        "model": {**asdict(raw.config), "params": raw.num_params(), "flops_per_token": raw.flops_per_token()},
        "device": {
            "type": device.type,
            "name": device_name(device),
            "count": world,
            "threads_per_process": torch.get_num_threads(),
        },
        "choices": {
            "amp_dtype": str(amp.dtype).removeprefix("torch."),
            "amp_why": amp.why,
            "grad_scaler": amp.scaler is not None,
            "fp32_matmuls": fp32_matmuls,
            "compile_mode": compile_mode(cfg, device),
            "pinned_memory_non_blocking": cfg.pin_memory and device.type == "cuda",
            "distributed_backend": distributed.backend_for(device) if cfg.distributed else None,
            "memory_method": method,
            "loss_impl": raw.config.loss_impl if cfg.loss == "chunked" else None,
        },
        "env": environment(),
        "metrics": {
            "seconds_mean": mean_s,
            "seconds_std": statistics.stdev(repeat_s) if len(repeat_s) > 1 else 0.0,
            "seconds_per_repeat": repeat_s,
            "samples_per_repeat": cfg.samples,
            "steps_per_repeat": cfg.steps_per_repeat,
            "tokens_per_s": tokens_per_s,
            "step_time_s": mean_s / cfg.steps_per_repeat,
            "step_time_median_s": steady,
            "step_times_s": step_s,
            "first_step_s": first_step_s,
            "warmup_s": warmup_s,
            # compilation happens in the first step; what it adds over a steady step is its cost
            "compile_s": (first_step_s - steady) if cfg.compile and first_step_s is not None else None,
            "compile_cache": compile_cache,
            "data_wait_pct": 100 * sum(waits) / sum(repeat_s),
            "copy_pct": 100 * sum(copies) / sum(repeat_s),
            **profiled,
            "peak_memory_mib": peak_mib,
            "peak_memory_allocated_mib": (cuda_peaks or {}).get("allocated"),
            "peak_memory_reserved_mib": (cuda_peaks or {}).get("reserved"),
            "memory_breakdown_mib": memory.get("breakdown_mib"),
            "memory_timeline_mib": memory.get("timeline_mib"),
            "memory_snapshot": memory.get("snapshot"),
            "flops_per_token": raw.flops_per_token(),
            "peak_flops_per_device": flops,
            "peak_flops_source": flops_source,
            "mfu_pct": _pct(mfu(tokens_per_s, raw.flops_per_token(), flops, world)),
            "peak_flops_fastest": best_flops,
            "peak_flops_fastest_source": best_source,
            "mfu_fastest_pct": _pct(mfu(tokens_per_s, raw.flops_per_token(), best_flops, world)),
            "loss_first": first_loss,
            "loss_final": statistics.fmean(losses[-cfg.steps_per_repeat:]),
            "losses": losses,
        },
    }


def tracked_step_memory(step, model, optimizer) -> dict:
    """One training step under MemTracker: the breakdown at its peak and the memory-over-time curve (CPU).
    A compiled model runs this step eager. Dynamo cannot trace under a dispatch mode such as the tracker's,
    and a frame it meets under one is marked "skip" for good: every later step would run eager too, with no
    recompilation to show for it. The "force_eager" stance keeps dynamo away from the step altogether."""
    tracker = TimelineMemTracker()
    tracker.track_external(model, optimizer)
    with torch.compiler.set_stance("force_eager"), tracker:
        tracker.reset_mod_stats()
        step()
    return {"breakdown_mib": memory_breakdown(tracker),
            "timeline_mib": _downsample([b / MiB for b in tracker.timeline], 400)}


def _all_reduce(values: list[float], device: torch.device, op, scale: float = 1.0) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=device)  # NCCL reduces GPU tensors only
    dist.all_reduce(t, op=op)
    return (t * scale).tolist()


def _downsample(xs: list[float], n: int) -> list[float]:
    """At most ~n points, keeping each window's maximum so the peak survives."""
    if len(xs) <= n:
        return xs
    w = math.ceil(len(xs) / n)
    return [max(xs[i : i + w]) for i in range(0, len(xs), w)]


def _pct(x: float | None) -> float | None:
    return None if x is None else 100 * x

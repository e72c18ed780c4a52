"""Feeding the device: a bigger batch, DataLoader workers, pinned memory, and batches made on the device.

The stages: speed_1 (batch), speed_2 (workers), speed_3 (pinned memory, non-blocking copies), fast_1 (pre-tokenised
batches made on the device). `make_loader` builds the batches from `training_data`, `to_device` copies each one.
"""

import torch
from torch.utils.data import DataLoader

from gpt.allocator_snapshot import MiB, cuda_block_bytes
from gpt.config import TrainConfig
from gpt.data import GatheredBatches, load_prepared, make_dataset
from gpt.errors import UserError
from gpt.formatting import fmt_share, steady_steps
from gpt.optimizations.optimization import Optimization, SimulationPlan

DATASETS = ("raw_text", "tokens")  # raw text processed per sample in __getitem__ | pre-tokenised windows


def training_data(cfg: TrainConfig):
    """The training split as the stage reads it: raw text (tokenised per sample), or pre-tokenised windows."""
    return make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size)


def make_loader(dataset, sampler, cfg: TrainConfig, device: torch.device):
    """Batches of `cfg.batch_size` samples (one optimizer step per rank).

    Workers run __getitem__'s per-sample CPU work beside training (persistent across repeats); pin_memory is asked for
    on CUDA only (without an accelerator there is no page-locked memory); batch_gather replaces the DataLoader with one
    indexing op on the device (gpt/data.py:GatheredBatches), the same batches."""
    if cfg.batch_gather:
        return GatheredBatches(dataset, sampler, device)
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=non_blocking(cfg, device),
        persistent_workers=cfg.num_workers > 0,
        prefetch_factor=2 if cfg.num_workers > 0 else None,
        drop_last=True,
    )


def non_blocking(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether batches are pinned and copied with non_blocking=True: only where there is a copy to overlap."""
    return cfg.pin_memory and device.type == "cuda"


def to_device(batch, device: torch.device, cfg: TrainConfig):
    """Copy a batch to the device.

    With pinned memory, non_blocking=True lets the host queue the copy and go on (the copy overlaps with GPU work
    already queued); from pageable memory, or to the CPU, it is an ordinary copy."""
    return tuple(t.to(device, non_blocking=non_blocking(cfg, device)) for t in batch)


# ---- speed_1: a bigger batch -------------------------------------------------------------------------------


def _bigger_batch_no_speedup(record: dict, parent: dict) -> str:
    return f"a bigger batch means fewer steps, but each step got slower in proportion ({steady_steps(record, parent)})"


BIGGER_BATCH = Optimization(
    name="bigger batch",
    fields=("batch_size",),
    code="gpt/optimizations/feeding.py:make_loader",
    no_speedup=_bigger_batch_no_speedup,
)


# ---- speed_2: DataLoader workers ---------------------------------------------------------------------------


def _check_workers(cfg: TrainConfig) -> None:
    if cfg.num_workers < 0:
        raise UserError(f"num_workers must be >= 0, got {cfg.num_workers}")


def _no_simulated_workers(plan: SimulationPlan) -> None:
    plan.cfg.num_workers = 0  # the planner feeds its fake batches itself


def _workers_no_speedup(record: dict, parent: dict) -> str | None:
    m, p, workers = record["metrics"], parent["metrics"], record["config"]["num_workers"]
    if not workers:
        return None  # the workers were taken away (fast_1): their removal is not this change's gain
    waits = f"data wait {p['data_wait_pct']:.0f}% of the time before, {m['data_wait_pct']:.0f}% now"
    why = (
        f"the previous stage hardly waited for data, so workers had little to win ({waits})"
        if p["data_wait_pct"] < 20
        else waits
    )
    if record["device"]["type"] == "cpu":
        why += f"; on a CPU the {workers} workers compete with training for the same cores"
    return why


WORKERS = Optimization(
    name="DataLoader workers",
    fields=("num_workers",),
    code="gpt/optimizations/feeding.py:make_loader",
    time_targets=("data",),
    checks=_check_workers,
    simulate=_no_simulated_workers,
    no_speedup=_workers_no_speedup,
)


# ---- speed_3: pinned memory and non-blocking copies --------------------------------------------------------


def _pinned_no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    if device.type != "cuda":
        return "no host-to-device copy to overlap: the batches already are in the memory the CPU computes from"
    return None


def _no_simulated_pinning(plan: SimulationPlan) -> None:
    plan.cfg.pin_memory = False


def _pinned_no_speedup(record: dict, parent: dict) -> str | None:
    p = parent["metrics"]
    copy = f"the copy took {fmt_share(p['copy_pct'])} of the time before" if p.get("copy_pct") is not None else ""
    if not record["choices"]["pinned_memory_non_blocking"]:
        return (
            "on a CPU there is no host-to-device copy to overlap (choices.pinned_memory_non_blocking is "
            "false), so this change does nothing here and the difference is run-to-run variation"
            + (f" ({copy})" if copy else "")
        )
    if copy:  # CUDA events around the copy: the copy, not the wait before it
        return f"{copy}, so an asynchronous copy had little to hide"
    return None


PINNED_MEMORY = Optimization(
    name="pinned memory + non_blocking copies",
    fields=("pin_memory",),
    code="gpt/optimizations/feeding.py:make_loader, to_device",
    time_targets=("copy", "data"),  # a blocking copy drains the GPU queue, which then idles while the next batch loads
    no_effect=_pinned_no_effect,
    simulate=_no_simulated_pinning,
    no_speedup=_pinned_no_speedup,
)


# ---- fast_1: pre-tokenised batches made on the device ------------------------------------------------------


def _check_on_device_batches(cfg: TrainConfig) -> None:
    if cfg.dataset not in DATASETS:
        raise UserError(f"unknown dataset kind {cfg.dataset!r} (choose raw_text or tokens)")
    if cfg.batch_gather and (cfg.dataset != "tokens" or cfg.num_workers):
        raise UserError(
            "batch_gather indexes the pre-tokenised token array in the training process: it "
            "needs dataset='tokens' and num_workers=0"
        )


def _no_simulated_gather(plan: SimulationPlan) -> None:
    plan.cfg.batch_gather = False  # the planner makes its batches in place


def _token_array(cfg: TrainConfig, raw, target: str):
    """The whole token array, int32, on the GPU (the simulation makes its batches in place and never holds it)."""
    if not (cfg.batch_gather and target == "cuda"):
        return None
    tokens = cuda_block_bytes(4 * load_prepared(cfg.data_dir).meta["train_tokens"]) / MiB
    return tokens, "batch_gather: the token array on the GPU", ""


def _on_device_no_speedup(record: dict, parent: dict) -> str:
    m, p = record["metrics"], parent["metrics"]
    return (
        f"data wait {p['data_wait_pct']:.0f}% and copy {fmt_share(p['copy_pct'])} of the time before, "
        f"{m['data_wait_pct']:.0f}% and {fmt_share(m['copy_pct'])} now ({steady_steps(record, parent)})"
    )


ON_DEVICE_BATCHES = Optimization(
    name="pre-tokenised batches gathered on the device",
    fields=("dataset", "batch_gather"),
    code="gpt/data.py:GatheredBatches (switched on in gpt/optimizations/feeding.py:make_loader)",
    time_targets=("data", "copy"),
    checks=_check_on_device_batches,
    simulate=_no_simulated_gather,
    unseen_memory=_token_array,
    no_speedup=_on_device_no_speedup,
)

"""The code each optimization of the ladders switches on, one named function per optimization.

Each function reads one field of TrainConfig (gpt/config.py) and leaves everything as it was when the
field is off, so a stage script's single change maps onto exactly one function here. The one exception
is gradient accumulation, which is the micro-batch loop of gpt/train.py:train_step.

    batch_size, num_workers      -> make_loader
    pin_memory (+ non_blocking)  -> make_loader, to_device
    compile                      -> compile_model
    amp                          -> mixed_precision
    activation_checkpointing     -> checkpoint_blocks
    optimizer_foreach            -> make_optimizer
    distributed (ddp / fsdp)     -> parallelize
"""
import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from gpt.config import TrainConfig


# ---- speed ladder: feeding the device -------------------------------------------------------------------


def make_loader(dataset, sampler, cfg: TrainConfig, device: torch.device) -> DataLoader:
    """Batches of `cfg.batch_size` samples (one optimizer step per rank).

    num_workers > 0 moves the per-sample CPU work (__getitem__) into worker processes so it overlaps
    with training; persistent workers keep them alive across repeats. pin_memory puts each batch in
    page-locked host memory, which a GPU can copy from asynchronously; there is no such thing without an
    accelerator, so it is only asked for on CUDA (elsewhere PyTorch would just warn)."""
    return DataLoader(
        dataset,
        batch_size=cfg.batch_size,
        sampler=sampler,
        num_workers=cfg.num_workers,
        pin_memory=cfg.pin_memory and device.type == "cuda",
        persistent_workers=cfg.num_workers > 0,
        prefetch_factor=2 if cfg.num_workers > 0 else None,
        drop_last=True,
    )


def to_device(batch, device: torch.device, cfg: TrainConfig):
    """Copy a batch to the device. With pinned memory, non_blocking=True lets the host queue the copy and
    go on (the copy overlaps with GPU work already queued); from pageable memory, or to the CPU, it is
    an ordinary copy."""
    non_blocking = cfg.pin_memory and device.type == "cuda"
    return tuple(t.to(device, non_blocking=non_blocking) for t in batch)


def compile_mode(cfg: TrainConfig, device: torch.device) -> str | None:
    """'reduce-overhead' (CUDA graphs: one launch replays the whole step's kernels) on CUDA, as the
    reference; CUDA graphs do not exist on the CPU, so the CPU gets the default mode."""
    if not cfg.compile:
        return None
    return "reduce-overhead" if device.type == "cuda" else "default"


def compile_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """torch.compile traces the model into graphs and fuses elementwise ops (GELU, dropout, softmax,
    layer norm) into fewer kernels that read and write memory once."""
    mode = compile_mode(cfg, device)
    return torch.compile(model, mode=mode) if mode else model


@dataclass
class MixedPrecision:
    dtype: torch.dtype  # the dtype matmuls compute in
    device_type: str
    scaler: torch.amp.GradScaler | None  # only for fp16

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def mixed_precision(cfg: TrainConfig, device: torch.device) -> MixedPrecision:
    """Autocast runs matmuls in 16-bit and keeps reductions (softmax, layer norm, the loss) in fp32.

    CUDA: fp16 with a GradScaler, as the reference (fp16 has a 5-bit exponent, so small gradients would
    underflow without scaling the loss). CPU: bf16, which has fp32's exponent range and needs no scaler;
    CPU fp16 kernels ran about 60x slower than fp32 on the machines this was built on."""
    if not cfg.amp:
        return MixedPrecision(torch.float32, device.type, None)
    if device.type == "cuda":
        return MixedPrecision(torch.float16, "cuda", torch.amp.GradScaler("cuda"))
    return MixedPrecision(torch.bfloat16, "cpu", None)


# ---- memory ladder ---------------------------------------------------------------------------------------


def checkpoint_blocks(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Activation checkpointing: keep only each transformer block's input during the forward pass and
    recompute the block's inside during backward. Trades about one extra forward for the activations of
    every block. The RNG state is saved and restored, so dropout masks (and gradients) are unchanged."""
    if not cfg.activation_checkpointing:
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    blocks = model.transformer.h
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
    return model


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW as the reference: weight decay on the weights of Linear layers (the tied embedding is the
    lm_head's weight, so it is one of them), none on biases, LayerNorm and position embeddings.

    foreach=True updates all parameters with a few multi-tensor kernels, which needs temporaries the
    size of all parameters at once; foreach=False loops over parameters, so its temporaries are one
    parameter's size. CUDA defaults to foreach and the CPU to the loop, so it is always passed."""
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if id(p) in decay_ids], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if id(p) not in decay_ids], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, foreach=cfg.optimizer_foreach)


# ---- both ladders: more than one process ---------------------------------------------------------------


def parallelize(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """DDP: every rank holds the whole model and trains on its own part of the batch; gradients are
    averaged across ranks (all-reduce, in buckets that overlap with backward).

    FSDP (FSDP2, `fully_shard`): every rank holds 1/W of each parameter, gradient and optimizer state.
    Each block is its own unit: its parameters are all-gathered just before its forward (and again
    before its backward) and freed after; gradients are reduce-scattered. The root call covers what is
    left (embeddings, final layer norm; the tied lm_head). Sharding settings live here: the blocks free
    their gathered parameters after forward (reshard_after_forward=True, ZeRO-3); the root keeps FSDP2's
    default, which keeps it unsharded from forward to backward, where it is needed first (resharding it
    would add an all-gather per step); fp32 throughout. The mesh is built on the stage's device: without
    one, fully_shard builds it on the machine's accelerator, and a CPU stage would move to cuda:0."""
    if cfg.distributed is None:
        return model
    if cfg.distributed == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh(device)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh)
    return model


def device_mesh(device: torch.device):
    """All ranks of the process group in one dimension, on `device`'s type."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))

"""The code each optimization of the ladders switches on, one named function per optimization.

Each function reads one field of TrainConfig (gpt/config.py) and leaves everything as it was when the
field is off, so a stage script's single change maps onto exactly one function here. The one exception
is gradient accumulation, which is the micro-batch loop of gpt/train.py:train_step.

    batch_size, num_workers      -> make_loader
    batch_gather                 -> make_loader (gpt/data.py:GatheredBatches)
    pin_memory (+ non_blocking)  -> make_loader, to_device
    compile                      -> compile_model
    amp, amp_bf16                -> mixed_precision
    tf32                         -> matmul_precision
    activation_checkpointing     -> checkpoint_blocks
    optimizer_foreach, _fused    -> make_optimizer
    loss                         -> gpt/chunked_loss.py:chunked_cross_entropy (called by gpt/model.py)
    distributed (ddp / fsdp)     -> parallelize (fsdp_mixed_precision, fsdp_cpu_offload: fsdp_policies)

Two more live in the model, since they change its shapes: attention ("sdpa": CausalSelfAttention.forward)
and vocab_multiple (GPTConfig.padded_vocab_size and GPT.vocab_mask). `why_no_effect` says which of them
change nothing on a given device, and why; the ladder records it instead of pretending to a gain.
"""
import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from gpt.config import TrainConfig
from gpt.data import GatheredBatches


# ---- speed ladder: feeding the device -------------------------------------------------------------------


def make_loader(dataset, sampler, cfg: TrainConfig, device: torch.device):
    """Batches of `cfg.batch_size` samples (one optimizer step per rank).

    num_workers > 0 moves the per-sample CPU work (__getitem__) into worker processes so it overlaps
    with training; persistent workers keep them alive across repeats. pin_memory puts each batch in
    page-locked host memory, which a GPU can copy from asynchronously; there is no such thing without an
    accelerator, so it is only asked for on CUDA (elsewhere PyTorch would just warn).
    batch_gather (pre-tokenised data only) replaces the DataLoader: the token array is on the device and
    each batch is one indexing op there (gpt/data.py:GatheredBatches), the same batches."""
    if cfg.batch_gather:
        return GatheredBatches(dataset, sampler, device)
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
    why: str = ""  # how the dtype was chosen, for the record

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def mixed_precision(cfg: TrainConfig, device: torch.device) -> MixedPrecision:
    """Autocast runs matmuls in 16-bit and keeps reductions (softmax, layer norm, the loss) in fp32.

    CUDA: fp16 with a GradScaler, as the reference (fp16 has a 5-bit exponent, so small gradients would
    underflow without scaling the loss); with amp_bf16, bf16, which has fp32's exponent range and needs no
    scaler (and so no host sync to check for infs every step). A GPU without bf16 keeps fp16.
    CPU: bf16 (no scaler) if this CPU multiplies bf16 matrices faster than fp32 ones, measured (a CPU with
    AMX or AVX512-BF16 units: several times faster; one without: emulated and slower), else fp32. CPU fp16
    kernels are slower than both on the machines this was built on, so the CPU never uses fp16."""
    if not cfg.amp:
        return MixedPrecision(torch.float32, device.type, None, "amp off")
    if device.type == "cuda":
        if cfg.amp_bf16 and torch.cuda.is_bf16_supported():
            return MixedPrecision(torch.bfloat16, "cuda", None, "bf16 autocast, no loss scaling")
        why = "fp16 autocast + GradScaler" + (" (this GPU has no bf16)" if cfg.amp_bf16 else "")
        return MixedPrecision(torch.float16, "cuda", torch.amp.GradScaler("cuda"), why)
    faster, rates = cpu_bf16_is_faster()
    if faster:
        return MixedPrecision(torch.bfloat16, "cpu", None, f"bf16 autocast ({rates})")
    return MixedPrecision(torch.float32, "cpu", None, f"kept fp32: bf16 is not faster here ({rates})")


def cpu_bf16_is_faster() -> tuple[bool, str]:
    """The CPU's one rule for computing in bf16 (autocast, FSDP's mixed precision): only where this CPU
    multiplies bf16 matrices faster than fp32 ones, measured. Seen on the machines this was built on:
    2.2x and 7x faster (AVX512-BF16, AMX), half as fast (AVX512-BF16 without AMX) and ~100x slower
    (AVX2 only: no bf16 instructions). Returns (faster, the two rates for the record)."""
    from gpt.flops import measure_cpu_matmul_flops  # cached per CPU model, threads and torch version

    bf16, fp32 = (measure_cpu_matmul_flops(dt) / 1e9 for dt in (torch.bfloat16, torch.float32))
    return bf16 > fp32, f"measured matmul rates on this CPU: bf16 {bf16:,.1f}, fp32 {fp32:,.1f} GFLOP/s"


def matmul_precision(cfg: TrainConfig, device: torch.device) -> str:
    """TF32 (CUDA, Ampere and newer): fp32 matmuls that autocast leaves in fp32 run on tensor cores with a
    10-bit mantissa, several times faster. Set for the whole process (it is global state), both ways, so a
    run never inherits an earlier run's setting. Returns what fp32 matmuls use."""
    if device.type != "cuda":
        return "fp32"
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    return "tf32" if cfg.tf32 and has_tf32(device) else "fp32"


def has_tf32(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8  # Ampere and newer


# ---- memory ladder ---------------------------------------------------------------------------------------


def checkpoint_blocks(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Activation checkpointing: keep only each transformer block's input during the forward pass and
    recompute the block's inside during backward. Trades about one extra forward for the activations of
    every block. The RNG state is saved and restored, so dropout masks (and gradients) are unchanged.

    early_stop=False: the recomputation runs the whole block (one residual add more) instead of stopping as
    soon as the last saved tensor is back. PyTorch stops it by raising an exception from inside that op (here
    the MLP's dropout); on torch 2.11 with CUDA, when the allocator records its history with Python stacks (the
    memory step), that exception is lost on its way out of the op and becomes "SystemError: <built-in method
    dropout> returned NULL without setting an exception" (pytorch/pytorch#179536, pytorch/tutorials#3774).
    Without early stop no exception crosses an op; the saved tensors, and so the gradients, are the same."""
    if not cfg.activation_checkpointing:
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    blocks = model.transformer.h
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, early_stop=False)
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
    # fused=True: one kernel per parameter group updates every parameter, reading each tensor once.
    impl = {"fused": True} if cfg.optimizer_fused else {"foreach": cfg.optimizer_foreach}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, **impl)


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
    would add an all-gather per step); precision and offloading in fsdp_policies. The mesh is built on the stage's device: without
    one, fully_shard builds it on the machine's accelerator, and a CPU stage would move to cuda:0."""
    if cfg.distributed is None:
        return model
    if cfg.distributed == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    mesh, policies = device_mesh(device), fsdp_policies(cfg, device)
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh, reshard_after_forward=True, **policies)
    fully_shard(model, mesh=mesh, **policies)
    return model


def device_mesh(device: torch.device):
    """All ranks of the process group in one dimension, on `device`'s type."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, (dist.get_world_size(),))

def fsdp_policies(cfg: TrainConfig, device: torch.device) -> dict:
    """FSDP2's precision and offloading settings (the "lean" ladder).

    fsdp_mixed_precision: each unit's parameters are all-gathered as bf16 copies and the unit computes in
    bf16 (half the bytes for gathered parameters and saved activations); the sharded fp32 parameters stay
    the master weights the optimizer updates, and gradients are reduce-scattered in fp32, so summing the
    ranks' contributions loses nothing to bf16. A CPU follows cpu_bf16_is_faster: one without bf16
    instructions would run the stage ~100x slower, so it keeps fp32 and the stage has no effect there.
    fsdp_cpu_offload: the sharded parameters, their gradients and AdamW's state live in pinned host memory;
    each unit's shard is copied to the GPU just before its all-gather, gradients go back to the host, and
    the optimizer step runs on the CPU. The GPU then holds little more than one unit's gathered parameters
    and the activations."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    policies = {}
    if cfg.fsdp_mixed_precision and (device.type != "cpu" or cpu_bf16_is_faster()[0]):
        policies["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.fsdp_cpu_offload:
        policies["offload_policy"] = CPUOffloadPolicy()
    return policies


# ---- what a change does on this device -------------------------------------------------------------------


def why_no_effect(field: str, cfg: TrainConfig, device: torch.device) -> str | None:
    """Why switching on `field` (as `cfg` has it) changes nothing that runs on `device`; None if it does."""
    if field == "pin_memory" and device.type != "cuda":
        return "no host-to-device copy to overlap: the batches already are in the memory the CPU computes from"
    if field == "amp":
        amp = mixed_precision(cfg, device)
        return amp.why if amp.dtype == torch.float32 else None
    if field == "amp_bf16":
        amp = mixed_precision(cfg, device)
        if device.type == "cpu":
            return f"the CPU's autocast never uses fp16 or a GradScaler (here: {amp.why})"
        return amp.why if amp.scaler else None
    if field == "fsdp_mixed_precision" and "mp_policy" not in fsdp_policies(cfg, device):
        return f"kept fp32 parameters for compute: bf16 is not faster here ({cpu_bf16_is_faster()[1]})"
    if field == "tf32" and not has_tf32(device):
        return "TF32 is a tensor-core format of NVIDIA GPUs from Ampere on: fp32 matmuls here are unchanged"
    return None

"""More than one process: DDP (speed_6) and FSDP2 (memory_4), and FSDP's precision and offloading policies.

The policies are lean_1 (bf16 compute with fp32 reduction) and lean_3 (CPU offload).

`parallelize` wraps the model; gpt/distributed.py launches the processes (torchrun), joins and leaves their group.
"""

import torch
import torch.nn as nn

from gpt import distributed
from gpt.allocator_snapshot import MiB, cuda_block_bytes
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization, SimulationPlan
from gpt.optimizations.precision import bf16_is_fast

MODES = (None, "ddp", "fsdp")


def is_distributed(cfg: TrainConfig) -> bool:
    """Whether the stage runs in a process group (DDP or FSDP)."""
    return cfg.distributed is not None


def launches(cfg: TrainConfig) -> bool:
    """Whether this process must start the stage's processes (torchrun) rather than be one of them."""
    return is_distributed(cfg) and not distributed.under_torchrun()


def with_processes(cfg: TrainConfig, n: int | None) -> TrainConfig:
    """`cfg` on `n` processes (a DDP/FSDP stage; a single-process stage, or n None, is left as it is)."""
    if n is not None and is_distributed(cfg):
        cfg.nproc = n
    return cfg


def backend(cfg: TrainConfig, device: torch.device) -> str | None:
    """The process group's backend (the record's choices.distributed_backend), None for one process."""
    return distributed.backend_for(device, host_collectives=cfg.fsdp_cpu_offload) if is_distributed(cfg) else None


def parallelize(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """The model wrapped for the stage's processes: DDP, FSDP2, or the model itself for one process.

    Each block is its own FSDP unit, resharded after forward (ZeRO-3); the root keeps FSDP2's default; the mesh is
    built on the stage's device, else a CPU stage would move to cuda:0 (docs/distributed.md#ddp-and-fsdp-here)."""
    if not is_distributed(cfg):
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

    bf16 compute only where bf16 is fast (precision.bf16_is_fast), with fp32 master weights and reduction; offload
    pins host memory only on CUDA (a CPU-only torch has none to give). What each does:
    docs/distributed.md#ddp-and-fsdp-here."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    policies = {}
    if cfg.fsdp_mixed_precision and bf16_is_fast(device.type)[0]:
        policies["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.fsdp_cpu_offload:
        policies["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    return policies


# ---- speed_6 (DDP) and memory_4 (FSDP) ----------------------------------------------------------------------


def _check_mode(cfg: TrainConfig) -> None:
    if cfg.distributed not in MODES:
        raise UserError(f"unknown distributed mode {cfg.distributed!r} (choose ddp or fsdp)")


def _cannot_launch(cfg: TrainConfig, device_type: str) -> str | None:
    return distributed.why_cannot_run(cfg.nproc, device_type) if launches(cfg) else None


def _one_ddp_rank(plan: SimulationPlan) -> None:
    if plan.cfg.distributed == "ddp":
        plan.cfg.distributed = None  # one rank: same per-rank batch, no reducer (gpt/memory/estimator.py says why)


def _ddp_buckets(cfg: TrainConfig, raw, target: str):
    """DDP's gradient buckets as memory the planner's simulation does not see (MiB, what, where), or None.

    One flat buffer per bucket (~25 MiB each) holds every gradient for the all-reduce, from the moment DDP wraps the
    model to the end of the run, so it adds to the peak wherever the peak is."""
    if cfg.distributed != "ddp" or target != "cuda":
        return None
    buckets = cuda_block_bytes(sum(p.numel() * p.element_size() for p in raw.parameters())) / MiB
    return buckets, "DDP: gradient buckets", " to the simulated rank"


def _no_speedup(record: dict, parent: dict) -> str | None:
    dev, pdev = record["device"], parent["device"]
    if dev["type"] != "cpu":
        return None
    return (
        f"on a CPU the {dev['count']} processes share the cores one process used before "
        f"({dev['threads_per_process']} thread(s) each vs {pdev['threads_per_process']}), so there "
        "is no extra compute to gain, and gradients must still be all-reduced"
    )


DATA_PARALLEL = Optimization(
    name="DDP / FSDP",
    fields=("distributed", "nproc"),
    code="gpt/optimizations/parallel.py:parallelize",
    time_targets=("forward", "backward", "communication"),
    memory_targets=("parameters", "gradients", "optimizer_state"),  # FSDP shards them; DDP keeps every one whole
    checks=_check_mode,
    cannot_run=_cannot_launch,
    simulate=_one_ddp_rank,
    unseen_memory=_ddp_buckets,
    no_speedup=_no_speedup,
)


# ---- lean_1: FSDP mixed precision ---------------------------------------------------------------------------


def _check_fsdp_setting(cfg: TrainConfig) -> None:
    if (cfg.fsdp_mixed_precision or cfg.fsdp_cpu_offload) and cfg.distributed != "fsdp":
        raise UserError("fsdp_mixed_precision and fsdp_cpu_offload are FSDP settings: they need distributed='fsdp'")


def _bf16_no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    if "mp_policy" in fsdp_policies(cfg, device):
        return None
    return f"kept fp32 parameters for compute: bf16 is not fast here ({bf16_is_fast(device.type)[1]})"


FSDP_MIXED_PRECISION = Optimization(
    name="FSDP mixed precision (bf16 compute, fp32 reduction)",
    fields=("fsdp_mixed_precision",),
    code="gpt/optimizations/parallel.py:fsdp_policies",
    time_targets=("forward", "backward", "communication"),
    memory_targets=("parameters", "activations"),  # bf16 gathered parameters, bf16 saved activations
    checks=_check_fsdp_setting,
    no_effect=_bf16_no_effect,
)


def compute_dtype(cfg: TrainConfig, device: torch.device, autocast_dtype: torch.dtype) -> torch.dtype:
    """The dtype the stage's matmuls compute in (the peak its MFU is taken against).

    It is autocast's, or, with autocast off, that of the bf16 parameter copies FSDP's mixed precision gathers for
    compute."""
    policy = fsdp_policies(cfg, device).get("mp_policy") if autocast_dtype == torch.float32 else None
    return policy.param_dtype if policy else autocast_dtype


# ---- lean_3: CPU offload ------------------------------------------------------------------------------------


def _cannot_offload(cfg: TrainConfig, device_type: str) -> str | None:
    if cfg.fsdp_cpu_offload and device_type != "cuda":
        return (
            "nothing to offload to: without a GPU, parameters, gradients and optimizer state already live "
            "in host memory"
        )
    return None


def _offload_simulated(plan: SimulationPlan) -> None:
    """CPU offload is simulated without the policy, and the planner's tracker counts the offloaded state apart.

    On fake CPU tensors everything is host memory anyway; the offloaded state is the sharded parameters, their
    gradients, AdamW's state and step."""
    if not plan.cfg.fsdp_cpu_offload:
        return
    if plan.target != "cuda":
        raise UserError("FSDP CPU offload moves state from a GPU to host memory: estimate it with --target cuda")
    plan.cfg.fsdp_cpu_offload, plan.state_on_host = False, True
    plan.notes.append(
        "CPU offload: sharded parameters, their gradients and the optimizer state are counted in "
        "host memory (host_mib), not in the GPU's peak"
    )


def _shards_in_transit(cfg: TrainConfig, raw, target: str):
    """The GPU memory of the shards CPU offload has in transit, which the simulation does not see, or None.

    A unit's fp32 shard copied in before its all-gather, and its gradient shard waiting to go back: one of each for the
    largest unit, wherever the peak is."""
    if not cfg.fsdp_cpu_offload:
        return None
    unit = max(sum(p.numel() for p in block.parameters()) for block in raw.transformer.h)
    copies = 2 * cuda_block_bytes(unit * 4 // cfg.world_size) / MiB
    return copies, "CPU offload: a unit's parameter and gradient shards in transit on the GPU", ""


CPU_OFFLOAD = Optimization(
    name="FSDP CPU offload",
    fields=("fsdp_cpu_offload",),
    code="gpt/optimizations/parallel.py:fsdp_policies",
    time_targets=("optimizer", "copy", "communication"),
    memory_targets=("parameters", "gradients", "optimizer_state"),
    checks=_check_fsdp_setting,
    cannot_run=_cannot_offload,
    simulate=_offload_simulated,
    unseen_memory=_shards_in_transit,
)

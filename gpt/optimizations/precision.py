"""Precision: autocast (speed_5), bf16 autocast without a GradScaler (fast_2), and TF32 tensor cores (fast_2).

`mixed_precision` chooses what a run computes in, `matmul_precision` sets TF32; `bf16_is_fast` is the one rule for
computing in bf16, which FSDP's mixed precision and Muon's Newton-Schulz follow too.
"""

import contextlib
from dataclasses import dataclass, field

import torch

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.formatting import steady_steps
from gpt.optimizations.optimization import Optimization, SimulationPlan


@dataclass
class MixedPrecision:
    """What a run computes in: autocast's dtype, and its GradScaler, enabled only for fp16."""

    dtype: torch.dtype  # the dtype matmuls compute in
    device_type: str
    why: str = ""  # how the dtype was chosen, for the record
    scaler: torch.amp.GradScaler = field(init=False, repr=False, compare=False)  # made from dtype: __post_init__

    def __post_init__(self):
        # fp16's 5-bit exponent underflows small gradients: scale the loss. Disabled (bf16, fp32), it passes through.
        self.scaler = torch.amp.GradScaler(self.device_type, enabled=self.dtype == torch.float16)

    def autocast(self):
        """The forward's context: torch.autocast to the run's dtype, or nothing where it computes in fp32."""
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def mixed_precision(cfg: TrainConfig, device: torch.device) -> MixedPrecision:
    """What a run computes in: autocast runs matmuls in 16-bit and keeps reductions (softmax, the loss, ...) in fp32.

    CUDA: fp16 with a GradScaler, as the reference; with amp_bf16, bf16 (fp32's exponent range: no scaler, so no host
    sync every step), where the GPU has bf16 units. CPU: bf16 where it was measured faster than fp32, else fp32; never
    fp16, whose CPU kernels are slower than both."""
    if not cfg.amp:
        return MixedPrecision(torch.float32, device.type, "amp off")
    if device.type == "cuda":
        if cfg.amp_bf16 and bf16_is_fast("cuda")[0]:
            return MixedPrecision(torch.bfloat16, "cuda", "bf16 autocast, no loss scaling")
        why = "fp16 autocast + GradScaler" + (" (this GPU has no bf16 units)" if cfg.amp_bf16 else "")
        return MixedPrecision(torch.float16, "cuda", why)
    faster, rates = bf16_is_fast("cpu")
    if faster:
        return MixedPrecision(torch.bfloat16, "cpu", f"bf16 autocast ({rates})")
    return MixedPrecision(torch.float32, "cpu", f"kept fp32: bf16 is not faster here ({rates})")


def simulated_precision(cfg: TrainConfig, target: str, sim_device: torch.device) -> MixedPrecision:
    """What the memory planner computes in: the CPU's measured rule, or 16 bits for a CUDA estimate that autocasts."""
    if target == "cpu":
        return mixed_precision(cfg, sim_device)
    return MixedPrecision(torch.bfloat16 if cfg.amp else torch.float32, sim_device.type)


def bf16_is_fast(device_type: str) -> tuple[bool, str]:
    """The one rule for computing in bf16 (autocast, FSDP's mixed precision, Muon's Newton-Schulz): (fast, why).

    A GPU: only with bf16 units (Ampere and newer; the default is_bf16_supported() counts a T4's or V100's emulated
    bf16, several times slower than fp16). A CPU: cpu_bf16_is_faster."""
    if device_type == "cuda":
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, "this GPU has bf16 units"
        return False, "this GPU has no bf16 units (only emulated bf16, slower than fp16)"
    return cpu_bf16_is_faster()


def cpu_bf16_is_faster() -> tuple[bool, str]:
    """The CPU's one rule for computing in bf16 (autocast, FSDP's mixed precision), from measured matmul rates.

    bf16 only where this CPU multiplies bf16 matrices faster than fp32 ones, measured (how far apart CPUs
    are: docs/design.md, "The figures behind the rules"). Returns (faster, the two rates for the record)."""
    from gpt.flops import measure_cpu_matmul_rates_in_turns  # cached per CPU model, threads and torch version

    # A decision needs only which is faster, and the CPUs measured differ by 2x or more either way: 1024 x 1024 matmuls
    # timed in turns for 5 calls each answer it, where two close dtypes get up to 0.6 s (docs/design.md, "Deciding
    # bf16 on a CPU quickly"). The MFU's peaks are the 2048 x 2048 ones, measured apart.
    n, rates = measure_cpu_matmul_rates_in_turns((torch.bfloat16, torch.float32), n=1024)
    bf16, fp32 = (rates[dt] / 1e9 for dt in (torch.bfloat16, torch.float32))
    return (
        bf16 > fp32,
        f"measured matmul rates on this CPU: bf16 {bf16:,.1f}, fp32 {fp32:,.1f} GFLOP/s ({n} x {n}, in turns)",
    )


def matmul_precision(cfg: TrainConfig, device: torch.device) -> str:
    """Sets TF32 (CUDA, Ampere and newer) for the fp32 matmuls autocast leaves; returns what fp32 matmuls use.

    With TF32 they run on tensor cores with a 10-bit mantissa, several times faster. Set for the whole
    process (it is global state), both ways, so a run never inherits an earlier run's setting."""
    if device.type != "cuda":
        return "fp32"
    torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
    torch.backends.cudnn.allow_tf32 = cfg.tf32
    return "tf32" if cfg.tf32 and has_tf32(device) else "fp32"


def has_tf32(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 8  # Ampere and newer


# ---- speed_5: autocast -------------------------------------------------------------------------------------


def _amp_no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    amp = mixed_precision(cfg, device)
    return amp.why if amp.dtype == torch.float32 else None


def _amp_simulated(plan: SimulationPlan) -> None:
    if plan.cfg.amp and plan.target == "cuda":
        plan.notes.append(
            "autocast simulated in bf16 with CUDA's op lists (softmax, layer norm, ... in fp32); "
            "CUDA's fp16 has the same sizes"
        )


def _amp_no_speedup(record: dict, parent: dict) -> str:
    return (
        f"autocast to {record['choices']['amp_dtype']} on {record['device']['name']} did not pay for its casts "
        f"at this size ({steady_steps(record, parent)})"
    )


AMP = Optimization(
    name="mixed precision (autocast)",
    fields=("amp",),
    code="gpt/optimizations/precision.py:MixedPrecision.autocast, mixed_precision",
    time_targets=("forward", "backward"),
    no_effect=_amp_no_effect,
    simulate=_amp_simulated,
    no_speedup=_amp_no_speedup,
)


# ---- fast_2: bf16 without a GradScaler, and TF32 -----------------------------------------------------------


def _check_bf16(cfg: TrainConfig) -> None:
    if cfg.amp_bf16 and not cfg.amp:
        raise UserError("amp_bf16 chooses the autocast dtype: it needs amp on")


def _bf16_no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    amp = mixed_precision(cfg, device)
    if device.type == "cpu":
        return f"the CPU's autocast never uses fp16 or a GradScaler (here: {amp.why})"
    return amp.why if amp.dtype == torch.float16 else None  # fp16: a GPU without bf16 units


BF16 = Optimization(
    name="bf16 autocast without a GradScaler",
    fields=("amp_bf16",),
    code="gpt/optimizations/precision.py:mixed_precision",
    time_targets=("forward", "backward", "optimizer"),  # the scaler's unscale, inf check and host sync
    checks=_check_bf16,
    no_effect=_bf16_no_effect,
)


def _tf32_no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    if not has_tf32(device):
        return "TF32 is a tensor-core format of NVIDIA GPUs from Ampere on: fp32 matmuls here are unchanged"
    return None


TF32 = Optimization(
    name="TF32 matmuls",
    fields=("tf32",),
    code="gpt/optimizations/precision.py:matmul_precision",
    time_targets=("forward", "backward"),
    no_effect=_tf32_no_effect,
)

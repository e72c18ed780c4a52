"""torch.compile (speed_4), and the rule that compiles only where it pays within the run (speedrun_12).

With torch.compile the model is traced into graphs whose element-wise ops are fused into fewer kernels; on CUDA in
"reduce-overhead" mode, which also records CUDA graphs (one launch replays a step's kernels). Under the rule, a short
run to a loss on a CPU stays eager.
"""

import torch
import torch.nn as nn

from gpt.config import TrainConfig
from gpt.formatting import fmt_time, steady_steps
from gpt.optimizations.optimization import Optimization, SimulationPlan, check_flag

# A CPU run to a loss with fewer optimizer steps than this stays eager under compile_if_it_pays: below it, a cold
# compilation costs more seconds than its faster steps save. Measured at the speedrun's shape on a 2-core EPYC
# (docs/design.md, "The figures behind the rules": its derivation, and why a GPU keeps compiling).
CPU_COMPILE_PAYS_AFTER_STEPS = 3000


def compile_choice(cfg: TrainConfig, device: torch.device) -> tuple[str | None, str | None]:
    """The mode a run compiles in (None: eager), and why a stage that asks to compile runs eager here.

    The reason is None where it compiles as asked, or does not ask. Asked once per run (gpt/choices.py). On CUDA
    'reduce-overhead', as the reference: CUDA graphs, one launch replays the whole step's kernels; they do not exist on
    the CPU, which gets the default mode."""
    why = compile_skipped(cfg, device)
    if not cfg.compile or why:
        return None, why
    return ("reduce-overhead" if device.type == "cuda" else "default"), None


def compile_mode(cfg: TrainConfig, device: torch.device) -> str | None:
    """The mode a run compiles in, None where it runs eager (compile_choice)."""
    return compile_choice(cfg, device)[0]


def compile_skipped(cfg: TrainConfig, device: torch.device) -> str | None:
    """Why a stage that asks to compile only where it pays runs eager here, or None (compiled as asked).

    It runs eager in a run to a loss on a CPU too short for a cold compilation to earn back its cost. A GPU compiles:
    its compiled step was not measured against an eager one at this shape here, and a CUDA graph removes the launch
    overhead that dominates a small model's eager step."""
    if not (cfg.compile and cfg.compile_if_it_pays) or device.type != "cpu" or not cfg.train_tokens:
        return None
    steps = cfg.train_tokens // cfg.tokens_per_step
    if steps >= CPU_COMPILE_PAYS_AFTER_STEPS:
        return None
    return (
        f"ran eager: {steps:,} steps, fewer than the {CPU_COMPILE_PAYS_AFTER_STEPS:,} after which compiling pays "
        "on a CPU (a cold compilation costs more than its faster steps save)"
    )


def uses_cuda_graphs(mode: str | None) -> bool:
    """Whether a step compiled in this mode replays CUDA graphs.

    Each step must then be marked as a new iteration, and what a graph returns is overwritten by its next replay unless
    it is copied."""
    return mode == "reduce-overhead"


def compile_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """The model compiled in the run's mode, or the model itself where it runs eager.

    torch.compile traces the model into graphs and fuses elementwise ops (GELU, dropout, softmax, layer norm) into fewer
    kernels that read and write memory once."""
    mode = compile_mode(cfg, device)
    return torch.compile(model, mode=mode) if mode else model


def _simulated_eager(plan: SimulationPlan) -> None:
    if plan.cfg.compile:
        plan.cfg.compile = False
        plan.notes.append("torch.compile is not simulated: estimated eager")


def _no_speedup(record: dict, parent: dict) -> str:
    return (
        f"the compiled steps were not faster at this size ({steady_steps(record, parent)}); compilation "
        f"itself took {fmt_time(record['metrics']['compile_s'])}, outside the timed repeats"
    )


COMPILE = Optimization(
    name="torch.compile",
    fields=("compile",),
    code="gpt/optimizations/compilation.py:compile_model",
    time_targets=("gpu_idle", "forward", "backward"),
    simulate=_simulated_eager,
    no_speedup=_no_speedup,
)


def _compiled_anyway(cfg: TrainConfig, device: torch.device) -> str | None:
    if compile_skipped(cfg, device):
        return None
    return "compiled as before: a GPU, or a run long enough for compiling to pay"


COMPILE_IF_IT_PAYS = Optimization(
    name="compile only where it pays",
    fields=("compile_if_it_pays",),
    code="gpt/optimizations/compilation.py:compile_skipped",
    checks=lambda cfg: check_flag(cfg, "compile_if_it_pays"),
    no_effect=_compiled_anyway,
)

"""torch.compile (speed_4): the model traced into graphs whose element-wise ops are fused into fewer kernels; on
CUDA in "reduce-overhead" mode, which also records CUDA graphs (one launch replays a step's kernels).
"""

import torch
import torch.nn as nn

from gpt.config import TrainConfig
from gpt.formatting import fmt_time, steady_steps
from gpt.optimizations.optimization import Optimization, SimulationPlan


def compile_mode(cfg: TrainConfig, device: torch.device) -> str | None:
    """'reduce-overhead' (CUDA graphs: one launch replays the whole step's kernels) on CUDA, as the
    reference; CUDA graphs do not exist on the CPU, so the CPU gets the default mode. None: not compiled."""
    if not cfg.compile:
        return None
    return "reduce-overhead" if device.type == "cuda" else "default"


def uses_cuda_graphs(cfg: TrainConfig, device: torch.device) -> bool:
    """Whether the step replays CUDA graphs: each step must then be marked as a new iteration, and what a graph
    returns is overwritten by its next replay unless it is copied."""
    return compile_mode(cfg, device) == "reduce-overhead"


def compile_model(model: nn.Module, cfg: TrainConfig, device: torch.device) -> nn.Module:
    """torch.compile traces the model into graphs and fuses elementwise ops (GELU, dropout, softmax,
    layer norm) into fewer kernels that read and write memory once."""
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

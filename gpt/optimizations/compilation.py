"""torch.compile (speed_4), and the rule that compiles only where it pays within the run (speedrun_12).

`compile_model` compiles in the mode the rule chooses (compile_mode, compile_choice, compile_skipped): on CUDA
"reduce-overhead", which also records CUDA graphs; eager for a run to a loss too short for a cold compilation to pay.
"""

from dataclasses import dataclass

import torch
import torch.nn as nn

from gpt.config import TrainConfig
from gpt.formatting import fmt_time, steady_steps
from gpt.optimizations.optimization import Optimization, SimulationPlan, check_flag


def compile_model(model: nn.Module, mode: str | None, device_type: str) -> nn.Module:
    """The model compiled in `mode` (element-wise ops fused into fewer kernels), or itself where `mode` is None."""
    if not mode:
        return model
    if serial_scatter_adds(mode, device_type):
        # the process-wide switch Inductor reads when it lowers: scatter-adds to ATen's serial kernel, not atomics
        torch.use_deterministic_algorithms(True)
        torch.utils.deterministic.fill_uninitialized_memory = False  # else every torch.empty is filled with NaN
    return torch.compile(model, mode=mode)


def serial_scatter_adds(mode: str | None, device_type: str) -> str | None:
    """What a compiled CPU run does with its scatter-adds (the embeddings' backward), or None where it changes nothing.

    Inductor lowers an embedding's backward to an index_put with accumulate, which its C++ kernels run with atomic adds
    across threads: the order of the additions, and so the last bits of the gradient, changed from call to call, and two
    runs of one seed reached the target at different steps. Under deterministic algorithms the lowering calls ATen's
    serial kernel instead (one order, every run), which on 2 CPU cores was no slower (docs/speedrun.md, the log of
    2026-12-05, "Why two runs of one compiled stage differ"). On CUDA unchanged: deterministic algorithms there need a
    cuBLAS workspace setting and a sorting scatter, neither measured (no GPU lent since)."""
    if not mode or device_type != "cpu":
        return None
    return "serial (torch.use_deterministic_algorithms): one order of additions, so two runs of one seed are one model"


# ---- the rule: the mode a run compiles in, eager where compiling would not pay (speedrun_12) -------------------------


@dataclass(frozen=True)
class CompileCost:
    """What a cold compilation costs on a kind of device, what it saves a step at most, and where both come from."""

    cold_s: float
    saving_per_step_s: float
    source: str

    @property
    def pays_after_steps(self) -> int:
        """The steps after which the saved seconds exceed the compilation's."""
        return round(self.cold_s / self.saving_per_step_s)


# Committed per kind of device; the measurements behind both: docs/design.md#the-figures-behind-the-rules.
COMPILE_COSTS = {
    "cpu": CompileCost(40.5, 0.0135, "measured: speedrun_11 on a 2-core EPYC, docs/design.md"),
    "cuda": CompileCost(
        17.8,
        0.0091,
        "rule: speed_4_compile's cold compilation on an H200 and its largest saving a step, on an H100 "
        "(records/h200-2026-11-27, records/h100-2026-11-24), as an upper bound",
    ),
}


def compile_choice(cfg: TrainConfig, device: torch.device) -> tuple[str | None, str | None]:
    """The mode a run compiles in (None: eager), and why a stage that asks to compile runs eager here (else None).

    On CUDA 'reduce-overhead', as the reference (CUDA graphs: one launch replays a step's kernels); else the default."""
    why = compile_skipped(cfg, device)
    if not cfg.compile or why:
        return None, why
    return ("reduce-overhead" if device.type == "cuda" else "default"), None


def compile_mode(cfg: TrainConfig, device: torch.device) -> str | None:
    """The mode a run compiles in, None where it runs eager (compile_choice)."""
    return compile_choice(cfg, device)[0]


def compile_skipped(cfg: TrainConfig, device: torch.device) -> str | None:
    """Why a stage that asks to compile only where it pays runs eager here, or None (compiled as asked).

    It runs eager in a run to a loss too short for a cold compilation to earn back its cost on this kind of device
    (COMPILE_COSTS); a kind with no figure, and the timed protocol (whose steps are the point), compile as asked."""
    cost = COMPILE_COSTS.get(device.type)
    if not (cfg.compile and cfg.compile_if_it_pays) or cost is None or not cfg.train_tokens:
        return None
    steps = cfg.train_tokens // cfg.tokens_per_step
    if steps >= cost.pays_after_steps:
        return None
    return (
        f"ran eager: {steps:,} steps, fewer than the {cost.pays_after_steps:,} after which compiling pays on a "
        f"{device.type} (a cold compilation of {cost.cold_s:.1f} s against at most "
        f"{1e3 * cost.saving_per_step_s:.1f} ms saved a step; {cost.source})"
    )


def uses_cuda_graphs(mode: str | None) -> bool:
    """Whether a step compiled in this mode replays CUDA graphs.

    Each step must then be marked as a new iteration, and what a graph returns is overwritten by its next replay unless
    it is copied."""
    return mode == "reduce-overhead"


def cuda_graphs_rule(cfg: TrainConfig, device: torch.device, kept: str) -> str | None:
    """The rule that keeps a kernel a run for time asks for under CUDA graphs, or None where it is measured instead.

    A kernel timed call by call does not run as a step's graphs replay it, so there the stage's own choice (`kept`) runs
    as asked, and the record says so (choices' attention_how, loss_how)."""
    if not uses_cuda_graphs(compile_mode(cfg, device)):
        return None
    return f"rule: {kept} as asked under CUDA graphs (a call timed on its own does not run as the graphs replay it)"


def startup_steps(cuda_graphs: bool) -> int:
    """The steps at a run's start whose time beyond a steady step is start-up (compile_s, startup_s), not training.

    The first (compilation, DataLoader workers); under CUDA graphs also the next two: cudagraph trees record a graph at
    its second call and first replay it at the third."""
    return 3 if cuda_graphs else 1


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
    return "compiled as before: a run long enough for compiling to pay here, or timed step by step"


COMPILE_IF_IT_PAYS = Optimization(
    name="compile only where it pays",
    fields=("compile_if_it_pays",),
    code="gpt/optimizations/compilation.py:compile_skipped",
    checks=lambda cfg: check_flag(cfg, "compile_if_it_pays"),
    no_effect=_compiled_anyway,
)

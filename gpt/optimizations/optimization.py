"""What the project knows about one optimization, declared once, in its home module beside its code.

An `Optimization` holds the TrainConfig fields that switch it on, the code they switch on, and its facts as small
functions (its fields say what each is) that the rest of the project calls instead of naming the fields.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

from gpt.config import TrainConfig
from gpt.errors import UserError


@dataclass
class SimulationPlan:
    """What the memory planner (gpt/memory) runs for a stage, as the optimizations rewrite it.

    It holds the settings that run on fake CPU tensors, the notes the estimate prints, and whether the training state
    lives in host memory."""

    cfg: TrainConfig  # the simulated settings; a simulate hook may change them
    target: str  # "cuda" or "cpu": whose memory is predicted
    source: TrainConfig  # the stage's own settings, as it runs them
    vocab_size: int  # of the data the stage trains on
    notes: list[str] = field(default_factory=list)
    state_on_host: bool = False  # FSDP CPU offload: parameters, gradients and optimizer state counted apart


@dataclass(frozen=True)
class Optimization:
    """One optimization of the ladders (see the module docstring); every hook is optional."""

    name: str  # as the report says it
    fields: tuple[str, ...]  # the TrainConfig fields that switch it on
    code: str  # where the code it switches on lives, for readers ("gpt/optimizations/compilation.py:compile_model")
    time_targets: tuple[str, ...] = ()  # the shares of a step's time it acts on
    memory_targets: tuple[str, ...] = ()  # the parts of the peak memory it acts on
    checks: Callable[[TrainConfig], None] | None = None  # raises UserError for settings it cannot take
    no_effect: Callable | None = None  # (cfg, device) -> why it changes nothing there, or None
    cannot_run: Callable | None = None  # (cfg, device_type) -> why a stage with it cannot run here, or None
    model: Callable | None = None  # (cfg, device_type, vocab_size) -> the GPTConfig fields it sets
    simulate: Callable[[SimulationPlan], None] | None = None  # rewrites the planner's plan (settings, notes)
    unseen_memory: Callable | None = None  # (cfg, raw model, target) -> (MiB, what, where) the simulation misses
    no_speedup: Callable | None = None  # (record, parent record) -> the measured reason it did not help, or None


def check_flag(cfg: TrainConfig, name: str) -> None:
    """A switch field must be a bool: one line naming it otherwise."""
    if not isinstance(getattr(cfg, name), bool):
        raise UserError(f"{name} must be true or false, got {getattr(cfg, name)!r}")

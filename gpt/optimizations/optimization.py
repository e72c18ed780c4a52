"""What the project knows about one optimization, declared once, in its home module beside its code.

Every optimization of the ladders is an `Optimization`: the TrainConfig fields that switch it on, the code they
switch on, and its facts, as small functions the rest of the project calls instead of naming the fields:

    checks        the settings it cannot take (gpt.optimizations.validate runs them)
    no_effect     why switching it on changes nothing on a device (the record's `no_effect`)
    cannot_run    why a stage with it cannot run on this machine (a `skipped` record)
    model         the GPTConfig settings it makes (gpt/train.py:build_model)
    simulate      how the memory planner runs it on fake tensors (gpt/memory), and what memory it adds there
    no_speedup    the measured reason it did not make a step faster (the report's findings)
    time_targets    the shares of a step's time it acts on (gpt/step_profiler.py:TIME_CATEGORIES)
    memory_targets  the parts of the peak memory it acts on (gpt/peak_memory.py:MEMORY_PARTS)

The registry of every optimization, and the questions asked of all of them at once, is gpt/optimizations/__init__.py.
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

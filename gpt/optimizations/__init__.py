"""Every optimization of the ladders, and the questions asked of all of them.

Each is declared once in its home module (`OPTIMIZATIONS` finds them there). A stage script changes TrainConfig
fields; each field belongs to exactly one optimization (`owner`), and what a stage changes against its parent is a
list of optimizations (`changed`), whose facts the ladder, the report and the planner read from here.
"""

import importlib
import pkgutil

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization, SimulationPlan


def _declared_in_homes() -> tuple[Optimization, ...]:
    """Every `Optimization` this package's modules declare at top level, home by home in the order of their names.

    Within a home they come in its order. A new optimization is found where it is declared: there is no list to add it
    to, and no question below depends on the order."""
    found: dict[int, Optimization] = {}
    for home in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        for value in vars(importlib.import_module(f"{__name__}.{home}")).values():
            if isinstance(value, Optimization):
                found.setdefault(id(value), value)  # one a home imports from another counts once
    return tuple(found.values())


OPTIMIZATIONS: tuple[Optimization, ...] = _declared_in_homes()
_OWNER = {f: opt for opt in OPTIMIZATIONS for f in opt.fields}


def owner(field: str) -> Optimization | None:
    """The optimization a TrainConfig field switches on (None: a field of the run, not of an optimization)."""
    return _OWNER.get(field)


def changed(before: dict, after: dict) -> list[Optimization]:
    """The optimizations whose fields differ between two configs, in the order of their first changed field.

    The configs are TrainConfig.to_dict() or a record's 'config'."""
    fields = [f for f, v in after.items() if f in _OWNER and before.get(f) != v]
    return list(dict.fromkeys(_OWNER[f] for f in fields))


def validate(cfg: TrainConfig) -> TrainConfig:
    """`cfg`, checked: a UserError for its first bad setting.

    The run's own settings come first (TrainConfig.check_run_settings: gpt.config knows no optimization), then the first
    an optimization cannot take."""
    cfg.check_run_settings()
    for opt in OPTIMIZATIONS:
        if opt.checks:
            opt.checks(cfg)
    return cfg


def why_no_effect(optimizations: list[Optimization], cfg, device) -> str | None:
    """'no effect on <device>: <why>' when every one of `optimizations` changes nothing on `device`, else None."""
    reasons = [opt.no_effect(cfg, device) if opt.no_effect else None for opt in optimizations]
    if not reasons or None in reasons:
        return None
    return f"no effect on {device.type}: " + "; ".join(dict.fromkeys(reasons))


def why_cannot_run(cfg, device_type: str) -> str | None:
    """Why a stage with `cfg` cannot run on this machine (a 'skipped' record), or None.

    Every optimization's reason is given, so that a user who removes one is not met by the next."""
    reasons = (opt.cannot_run(cfg, device_type) for opt in OPTIMIZATIONS if opt.cannot_run)
    return "; ".join(dict.fromkeys(r for r in reasons if r)) or None


def model_settings(cfg, device_type: str, vocab_size: int) -> dict:
    """The GPTConfig fields the optimizations set (attention, vocabulary padding, the loss)."""
    settings = {}
    for opt in OPTIMIZATIONS:
        if opt.model:
            settings.update(opt.model(cfg, device_type, vocab_size))
    return settings


def plan_simulation(plan: SimulationPlan) -> SimulationPlan:
    """Every optimization rewrites the memory planner's plan: what it cannot simulate, and how it stands in."""
    for opt in OPTIMIZATIONS:
        if opt.simulate:
            opt.simulate(plan)
    return plan


def unseen_memory(cfg, raw, target: str) -> list[tuple[float, str, str]]:
    """Memory the planner's simulation does not see, as (MiB, what, where) for each optimization that adds some."""
    found = (opt.unseen_memory(cfg, raw, target) for opt in OPTIMIZATIONS if opt.unseen_memory)
    return [f for f in found if f]


def time_targets(optimizations: list[Optimization]) -> list[str]:
    """The shares of a step's time these optimizations act on, each once."""
    return list(dict.fromkeys(c for opt in optimizations for c in opt.time_targets))


def no_speedup(optimizations: list[Optimization], record: dict, parent: dict) -> str | None:
    """The first measured reason one of `optimizations` gives for not making the step faster, or None."""
    reasons = (opt.no_speedup(record, parent) for opt in optimizations if opt.no_speedup)
    return next((r for r in reasons if r), None)

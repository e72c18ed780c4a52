"""Python's cyclic garbage collector kept off the set-up's objects (speedrun): `gc.freeze()` before and after set-up.

A full (oldest-generation) collection scans every object the collector tracks, and a stage process keeps a few hundred
thousand alive from its imports and set-up on, `torch._dynamo`'s modules among them (torch.optim's `add_param_group`
is wrapped by `torch._disable_dynamo`, which imports it, even in a run that never compiles); full collections ran
inside the set-up and at exit. `gc.freeze()` moves every object alive into a permanent generation that no collection
scans: the objects the steps make afterwards are collected as before, and nothing the set-up made was garbage to begin
with (it lives until the process ends). The arithmetic is untouched. Measured: docs/speedrun.md, the log of 2026-12-02.
"""

import gc

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization, check_flag


def freeze_live_objects(cfg: TrainConfig) -> None:
    """Move every object alive now out of the collector's reach (for the rest of the process), where the run asks."""
    if cfg.gc_freeze:
        gc.freeze()


COLLECTOR = Optimization(
    name="the collector kept off the set-up's objects",
    fields=("gc_freeze",),
    code="gpt/optimizations/collector.py:freeze_live_objects (called by gpt/train.py:prepare)",
    checks=lambda cfg: check_flag(cfg, "gc_freeze"),
)

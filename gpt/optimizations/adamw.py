"""AdamW's implementations: the per-parameter for-loop (memory_3: foreach=False) and the fused kernel (fast_5).

`make_optimizer` builds the stage's AdamW; the reference's multi-tensor (foreach) path is the default.
"""

import torch
import torch.nn as nn

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization


def make_optimizer(model: nn.Module, cfg: TrainConfig, skip=()) -> torch.optim.AdamW:
    """AdamW as the reference: weight decay on Linear layers' weights (the tied embedding among them), none on the rest.

    `skip`: parameters another optimizer updates (Muon's hidden matrices). foreach=True updates all parameters with a
    few multi-tensor kernels and temporaries the size of all of them; foreach=False loops, with one parameter's
    temporaries. CUDA defaults to foreach and the CPU to the loop, so it is always passed."""
    groups = parameter_groups(model, cfg, skip)
    if cfg.optimizer_fused:  # one kernel per parameter group updates every parameter, reading each tensor once
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=True)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, foreach=cfg.optimizer_foreach)


def parameter_groups(model: nn.Module, cfg: TrainConfig, skip=()) -> list[dict]:
    """AdamW's two groups of the parameters not in `skip`: the Linear layers' weights with decay, the rest without."""
    decay_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    skip_ids = {id(p) for p in skip}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in skip_ids]
    return [
        {"params": [p for p in params if id(p) in decay_ids], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if id(p) not in decay_ids], "weight_decay": 0.0},
    ]


FOREACH_OFF = Optimization(
    name="AdamW foreach=False",
    fields=("optimizer_foreach",),
    code="gpt/optimizations/adamw.py:make_optimizer",
    time_targets=("optimizer",),
    memory_targets=("optimizer_state",),
)  # MemTracker counts what optimizer.step allocates as optimizer state

FUSED_ADAMW = Optimization(
    name="fused AdamW",
    fields=("optimizer_fused",),
    code="gpt/optimizations/adamw.py:make_optimizer",
    time_targets=("optimizer",),
)

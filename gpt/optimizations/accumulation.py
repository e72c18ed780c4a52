"""Gradient accumulation (memory_1): each batch split into micro-batches whose losses are divided by their number,
so the summed gradients are the whole batch's, with one micro-batch's activations alive at a time.

The code is the micro-batch loop of gpt/train.py:train_step (with DDP, only the last micro-batch all-reduces).
"""
from typing import TYPE_CHECKING

from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization

if TYPE_CHECKING:  # annotations only: gpt.config calls back into gpt.optimizations
    from gpt.config import TrainConfig


def _check(cfg: "TrainConfig") -> None:
    if cfg.grad_accum_steps < 1 or cfg.batch_size % cfg.grad_accum_steps:
        raise UserError(f"batch size {cfg.batch_size} must be a multiple of grad_accum_steps {cfg.grad_accum_steps}")


GRADIENT_ACCUMULATION = Optimization(
    name="gradient accumulation", fields=("grad_accum_steps",), code="gpt/train.py:train_step",
    memory_targets=("activations",), checks=_check)

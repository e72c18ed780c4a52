"""Gradient accumulation (memory_1): each batch split into micro-batches, one micro-batch's activations alive at a time.

The code is the micro-batch loop of gpt/train.py:train_step (with DDP, only the last micro-batch all-reduces).
"""

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization


def _check(cfg: TrainConfig) -> None:
    if cfg.grad_accum_steps < 1 or cfg.batch_size % cfg.grad_accum_steps:
        raise UserError(f"batch size {cfg.batch_size} must be a multiple of grad_accum_steps {cfg.grad_accum_steps}")


def micro_batches(cfg: TrainConfig) -> int:
    """How many micro-batches each batch is trained as."""
    return cfg.grad_accum_steps


def split_further(cfg: TrainConfig, factor: int) -> TrainConfig:
    """`cfg` with every micro-batch split into `factor`; a UserError where the batch does not divide.

    The update is the same up to rounding: gpt/noise_scale.py reads the halves' gradients this way, and validates it."""
    if cfg.batch_size % (factor * cfg.grad_accum_steps):
        raise UserError(
            f"batch size {cfg.batch_size} does not split into {factor} x {cfg.grad_accum_steps} micro-batches"
        )
    return type(cfg).from_dict({**cfg.to_dict(), "grad_accum_steps": factor * cfg.grad_accum_steps})


GRADIENT_ACCUMULATION = Optimization(
    name="gradient accumulation",
    fields=("grad_accum_steps",),
    code="gpt/train.py:train_step",
    memory_targets=("activations",),
    checks=_check,
)

"""Activation checkpointing (memory_2): each block keeps only its input in the forward pass and recomputes the rest."""

import torch.nn as nn

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization


def checkpoint_blocks(model: nn.Module, cfg: TrainConfig) -> nn.Module:
    """Keep only each transformer block's input in the forward pass and recompute the block's inside during backward.

    The RNG state is saved and restored, so dropout masks (and gradients) are unchanged. early_stop=False: the
    recomputation runs the whole block instead of stopping, by an exception raised inside an op, once the last saved
    tensor is back; on torch 2.11 with CUDA, while the allocator records Python stacks (the memory step), that exception
    is lost and becomes "SystemError: <built-in method dropout> returned NULL without setting an exception"
    (pytorch/pytorch#179536, pytorch/tutorials#3774). Without early stop, the same saved tensors and gradients."""
    if not cfg.activation_checkpointing:
        return model
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = model.transformer.h
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, early_stop=False)
    return model


ACTIVATION_CHECKPOINTING = Optimization(
    name="activation checkpointing",
    fields=("activation_checkpointing",),
    code="gpt/optimizations/checkpointing.py:checkpoint_blocks",
    time_targets=("backward",),
    memory_targets=("activations",),
)

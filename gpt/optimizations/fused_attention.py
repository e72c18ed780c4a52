"""Fused attention (fast_3): F.scaled_dot_product_attention instead of the explicit B x H x T x T scores.

The code is the model's own, gpt/model.py:CausalSelfAttention.forward, which has both paths ("naive" writes,
masks, softmaxes and reads the score matrix; "sdpa" computes the softmax block by block and never stores it);
gpt/model.py:GPTConfig checks the value. What the memory planner knows about CUDA's fused kernels (flash and
memory-efficient attention keep the output and a logsumexp, not the scores) is in gpt/memory/__init__.py:_cuda_sdpa.
"""
from typing import TYPE_CHECKING

from gpt.optimizations.optimization import Optimization

if TYPE_CHECKING:  # annotations only: gpt.config calls back into gpt.optimizations
    from gpt.config import TrainConfig


def _model_settings(cfg: "TrainConfig", device_type: str) -> dict:
    return {"attention": cfg.attention}


FUSED_ATTENTION = Optimization(
    name="fused attention (SDPA)", fields=("attention",), code="gpt/model.py:CausalSelfAttention.forward",
    time_targets=("forward", "backward"), memory_targets=("activations",), model=_model_settings)

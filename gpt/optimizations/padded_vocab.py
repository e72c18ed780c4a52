"""The vocabulary padded to a multiple of 64 (fast_4: 50257 -> 50304 rows), shapes the matmul kernels tile evenly.

The code is the model's own: gpt/model.py:GPTConfig.padded_vocab_size sizes the embedding and the head, and
GPT.vocab_mask gives the padding rows a -inf logit bias (docs/design.md#beyond-the-book-the-fast-and-lean-ladders).
"""

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization


def _check(cfg: TrainConfig) -> None:
    if cfg.vocab_multiple < 1:
        raise UserError(f"vocab_multiple must be >= 1, got {cfg.vocab_multiple}")


def _model_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"vocab_multiple": cfg.vocab_multiple}


PADDED_VOCAB = Optimization(
    name="padded vocabulary",
    fields=("vocab_multiple",),
    code="gpt/model.py:GPTConfig.padded_vocab_size, GPT.__init__ (its vocab_mask buffer)",
    time_targets=("forward", "backward"),
    checks=_check,
    model=_model_settings,
)

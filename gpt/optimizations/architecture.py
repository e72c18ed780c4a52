"""Today's small-GPT architecture (the speedrun ladder): the blocks of modded-nanogpt and nanochat instead of GPT-2's.

This CHANGES the model: it is a different function with different parameters, trained from its own initialisation, so
no equivalence with GPT-2 is claimed; a stage with it is judged only by how soon it reaches the same target validation
loss.

`architecture="modern"` sets five GPTConfig fields; the code is the model's own (gpt/model.py), each field
switching one change, so a single change can also be built and measured alone:

    mlp="relu2"           the MLP's activation is relu(x)^2 instead of GELU (So et al. 2021, "Primer: Searching
                          for Efficient Transformers for Language Modeling": found by architecture search, it
                          reached the same loss with fewer training FLOPs; modded-nanogpt's record log adopted
                          it in its early records). Cheaper than GELU, and sparse: negative inputs give exact 0.
    norm="rmsnorm"        RMSNorm instead of LayerNorm in the blocks and before the head (Zhang & Sennrich 2019,
                          "Root Mean Square Layer Normalization"): x / rms(x) * weight; no mean subtracted and no
                          bias. Re-centring was found not to be what makes LayerNorm work; one reduction instead
                          of two, fewer parameters.
    qk_norm=True          each head's q and k RMS-normalised (a learned gain per dimension) before the scores
                          (Henry et al. 2020, "Query-Key Normalization for Transformers"; Dehghani et al. 2023,
                          "Scaling Vision Transformers to 22 Billion Parameters"): the scores stay bounded,
                          so the attention logits cannot grow without limit and saturate the softmax, which lets
                          a higher learning rate train stably.
    zero_init_proj=True   the attention's and the MLP's output projections (c_proj) start at zero: every block
                          starts as the identity and the residual stream carries the embeddings unchanged to
                          the head, each block adding its part as it learns (modded-nanogpt's record log;
                          nanochat; the idea of ReZero/SkipInit, Bachlechner et al. 2020, De & Smith 2020).
    positions="rotary"    no learned position table: each head's q and k are rotated by an angle proportional
                          to their position (RoPE; Su et al. 2021, "RoFormer"), so the scores depend on relative
                          positions only. Half-split pairs (dimension i with i + head_size/2, as GPT-NeoX and
                          Llama), applied after the QK-norm.

Together these are the architecture of modded-nanogpt's later records and of nanochat (which also untie the head
and add other changes not made here). What each one gave on this project's data, alone and together, is measured
by time to the baseline's loss (the speedrun ladder's log).
"""

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization, check_flag

ARCHITECTURES = ("gpt2", "modern")

# The GPTConfig fields "modern" sets (gpt/model.py; "gpt2" keeps GPTConfig's defaults).
MODERN = dict(mlp="relu2", norm="rmsnorm", qk_norm=True, zero_init_proj=True, positions="rotary")


def _check(cfg: TrainConfig) -> None:
    if cfg.architecture not in ARCHITECTURES:
        raise UserError(f"unknown architecture {cfg.architecture!r}; choose one of {', '.join(ARCHITECTURES)}")


def _model_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return dict(MODERN) if cfg.architecture == "modern" else {}


def _check_x0(cfg: TrainConfig) -> None:
    check_flag(cfg, "x0_shortcut")


def _x0_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"x0_shortcut": True} if cfg.x0_shortcut else {}


# The x0 shortcut (speedrun_9): each block's input is a_i * x + b_i * x0, x0 the embedding (token and bigram, after
# dropout), a_i and b_i learned scalars per block starting at 1 and 0, so the model starts as the one without it
# (modded-nanogpt's "x0 lambdas"): every block can read the input tokens directly, however much the blocks before it
# wrote over them. AdamW trains the scalars (no weight decay: not a Linear's weight), Muon never (not a matrix).
X0_SHORTCUT = Optimization(
    name="x0 shortcut (the embedding mixed into every block's input by learned scalars)",
    fields=("x0_shortcut",),
    code="gpt/model.py:GPT.forward (GPTConfig.x0_shortcut: GPT.resid_scales, GPT.x0_scales)",
    checks=_check_x0,
    model=_x0_settings,
)


MODERN_ARCHITECTURE = Optimization(
    name="today's small-GPT architecture (ReLU², RMSNorm, QK-norm, zero-init projections, rotary)",
    fields=("architecture",),
    code="gpt/model.py: GPTConfig's mlp, norm, qk_norm, zero_init_proj, positions (MLP, RMSNorm, rotary, "
    "CausalSelfAttention, GPT.init_weights)",
    checks=_check,
    model=_model_settings,
)

"""Today's small-GPT architecture (the speedrun ladder): the blocks of modded-nanogpt and nanochat instead of GPT-2's.

This CHANGES the model (no equivalence with GPT-2 is claimed; a stage with it is judged by how soon it reaches the
target). `architecture="modern"` sets five GPTConfig fields (MODERN), each switching one change in gpt/model.py, so
one can be built alone; what each is and where it comes from: docs/speedrun.md#the-models-changes-and-their-sources.
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


# The x0 shortcut (speedrun_9): each block's input is a_i * x + b_i * x0, x0 the embedding, a_i and b_i learned
# scalars starting at 1 and 0 (docs/speedrun.md#the-models-changes-and-their-sources).
X0_SHORTCUT = Optimization(
    name="x0 shortcut (the embedding mixed into every block's input by learned scalars)",
    fields=("x0_shortcut",),
    code="gpt/model.py:GPT.forward (GPTConfig.x0_shortcut: GPT.resid_scales, GPT.x0_scales)",
    checks=_check_x0,
    model=_x0_settings,
)


def _check_untied(cfg: TrainConfig) -> None:
    check_flag(cfg, "untied_head")


def _untied_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"untied_head": True} if cfg.untied_head else {}


# The untied head (speedrun_20): the output head its own vocab x n_embd matrix instead of the token embedding's
# (modded-nanogpt and nanochat untie it; docs/speedrun.md#the-models-changes-and-their-sources).
UNTIED_HEAD = Optimization(
    name="untied output head (the head its own matrix, not the token embedding)",
    fields=("untied_head",),
    code="gpt/model.py:GPT.__init__ (GPTConfig.untied_head: no tying; GPT.init_weights draws the head last)",
    checks=_check_untied,
    model=_untied_settings,
)


MODERN_ARCHITECTURE = Optimization(
    name="today's small-GPT architecture (ReLU², RMSNorm, QK-norm, zero-init projections, rotary)",
    fields=("architecture",),
    code="gpt/model.py: GPTConfig's mlp, norm, qk_norm, zero_init_proj, positions (MLP, RMSNorm, rotary, "
    "CausalSelfAttention, GPT.init_weights)",
    checks=_check,
    model=_model_settings,
)

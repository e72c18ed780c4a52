"""The n-gram embeddings (the speedrun ladder): learned vectors for token pairs, triples and four-grams.

Each is a table indexed by the pair (bigram, speedrun_6), the hashed triple (trigram, speedrun_10) or the hashed
four-gram (fourgram, speedrun_17) ending at a position, added to the token embedding. This CHANGES the model (new
parameters); the tables start at zero, so the first forward is the parent's. `bigram_embedding`, `trigram_embedding`
and `fourgram_embedding` set GPTConfig's bigram_rows, trigram_rows and fourgram_rows; the code is the model's
(gpt/model.py: bigram_index, hashed_ngram_index, GPT). Why, and what they cost:
docs/speedrun.md#the-models-changes-and-their-sources.
"""

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization, check_flag

BIGRAM_MAX_ROWS = 2**16  # an exact table up to a vocabulary of 255; a larger one (GPT-2's) is hashed into this
TRIGRAM_ROWS = 8192  # the hashed trigram table's rows (the one size tried: docs/speedrun.md)
FOURGRAM_ROWS = 2**16  # the hashed four-gram table's rows: 4,096 to 131,072 tried (docs/speedrun.md)


def bigram_rows(vocab_size: int) -> int:
    """The bigram table's row count: one per (previous token or none, token) pair, at most BIGRAM_MAX_ROWS."""
    return min((vocab_size + 1) * vocab_size, BIGRAM_MAX_ROWS)


def _check(cfg: TrainConfig) -> None:
    check_flag(cfg, "bigram_embedding")


def _model_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"bigram_rows": bigram_rows(vocab_size)} if cfg.bigram_embedding else {}


BIGRAM_EMBEDDING = Optimization(
    name="bigram embedding",
    fields=("bigram_embedding",),
    code="gpt/model.py:bigram_index, GPT.forward (GPTConfig.bigram_rows)",
    checks=_check,
    model=_model_settings,
)


def _check_trigram(cfg: TrainConfig) -> None:
    check_flag(cfg, "trigram_embedding")


def _trigram_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"trigram_rows": TRIGRAM_ROWS} if cfg.trigram_embedding else {}


TRIGRAM_EMBEDDING = Optimization(
    name="hashed trigram embedding",
    fields=("trigram_embedding",),
    code="gpt/model.py:trigram_index, GPT.forward (GPTConfig.trigram_rows)",
    checks=_check_trigram,
    model=_trigram_settings,
)


def _check_fourgram(cfg: TrainConfig) -> None:
    check_flag(cfg, "fourgram_embedding")


def _fourgram_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"fourgram_rows": FOURGRAM_ROWS} if cfg.fourgram_embedding else {}


FOURGRAM_EMBEDDING = Optimization(
    name="hashed four-gram embedding",
    fields=("fourgram_embedding",),
    code="gpt/model.py:fourgram_index, GPT.forward (GPTConfig.fourgram_rows)",
    checks=_check_fourgram,
    model=_fourgram_settings,
)

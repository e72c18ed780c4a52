"""The bigram and trigram embeddings (the speedrun ladder): learned vectors for token pairs and triples.

The bigram embedding is a learned vector for each (previous token, token) pair, added to the token embedding. This
CHANGES the model (new parameters), so no equivalence is claimed; it starts at zero, so the model's first forward is
its parent's, and a stage with it is judged by how soon it reaches the target loss.

The token embedding tells the first block which token stands at a position; which pair ends there the blocks must
find by attention. A table indexed by the pair hands it over at the input, for one lookup (modded-nanogpt's record
log, its bigram hash embedding; nanochat's likewise). Where the vocabulary is small, as the characters here, the
table has a row for every pair, (vocab + 1) x vocab rows; above BIGRAM_MAX_ROWS the pairs are hashed into that many.
Position 0 of a window has no previous token: it takes a dedicated previous index (the vocabulary's size, never a
token), so nothing reaches a window from outside it. The table is an embedding: AdamW updates it (in the group
without weight decay, gpt/optimizations/adamw.py), never Muon (gpt/optimizations/muon.py: the blocks' matrices only).

`bigram_embedding=True` sets GPTConfig's bigram_rows; the code is the model's (gpt/model.py: bigram_index, GPT).

The trigram embedding (speedrun_10) does the same for each (token-2, token-1, token) triple, added beside the bigram
table: an exact table would have (vocab + 1)^2 x vocab rows (525,000 for the characters), so the triples are hashed
into TRIGRAM_ROWS rows (modded-nanogpt's and nanochat's hashed n-gram embeddings). Zero at the start, AdamW without
weight decay, never Muon, as the bigram table. It costs per-step work the bigram table already costs: AdamW updates
all its TRIGRAM_ROWS x n_embd entries every step (1,048,576 at n_embd 128, more than the rest of the model), while a
batch reads a few thousand rows. `trigram_embedding=True` sets GPTConfig's trigram_rows (gpt/model.py:
trigram_index, GPT).
"""

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization, check_flag

BIGRAM_MAX_ROWS = 2**16  # an exact table up to a vocabulary of 255; a larger one (GPT-2's) is hashed into this
TRIGRAM_ROWS = 8192  # the hashed trigram table's rows (the one size tried: docs/speedrun.md)


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

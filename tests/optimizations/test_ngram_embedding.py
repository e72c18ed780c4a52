"""The bigram embedding (gpt/optimizations/ngram_embedding.py, code in gpt/model.py) starts at zero and learns.

It starts at zero so the first forward is the parent's, it learns through AdamW (never Muon), a window's first position
has no previous token, and a large vocabulary is hashed into a bounded table."""

import pytest
import torch

from gpt import optimizations, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.model import GPT, GPTConfig, bigram_index, trigram_index
from gpt.optimizations.architecture import MODERN
from gpt.optimizations.ngram_embedding import BIGRAM_MAX_ROWS, TRIGRAM_ROWS, bigram_rows

TINY = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=11, block_size=16, dropout=0.0, **MODERN)


def pair(seed=0):
    """The model without the table and with it, built from the same seed."""
    torch.manual_seed(seed)
    plain = GPT(GPTConfig(**TINY))
    torch.manual_seed(seed)
    bigram = GPT(GPTConfig(**TINY, bigram_rows=bigram_rows(TINY["vocab_size"])))
    return plain, bigram


def test_the_setting_makes_an_exact_table_for_a_small_vocabulary_and_a_bounded_one_for_a_large():
    cfg = optimizations.validate(TrainConfig(bigram_embedding=True))
    assert optimizations.model_settings(cfg, "cpu", 80)["bigram_rows"] == 81 * 80
    assert optimizations.model_settings(cfg, "cpu", 50257)["bigram_rows"] == BIGRAM_MAX_ROWS
    assert "bigram_rows" not in optimizations.model_settings(TrainConfig(), "cpu", 80)
    assert optimizations.owner("bigram_embedding").name == "bigram embedding"
    with pytest.raises(UserError, match="bigram_embedding must be true or false"):
        optimizations.validate(TrainConfig(bigram_embedding="yes"))
    with pytest.raises(UserError, match="bigram_rows must be a non-negative integer"):
        GPTConfig(**TINY, bigram_rows=-1)


def test_it_starts_at_zero_and_the_first_forward_is_the_parents_exactly():
    plain, bigram = pair()
    assert torch.equal(bigram.transformer.bigram.weight, torch.zeros_like(bigram.transformer.bigram.weight))
    shared = dict(bigram.named_parameters())
    for name, p in plain.named_parameters():  # every other weight drawn alike: the table is off the random stream
        assert torch.equal(p, shared[name]), name
    idx = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    (logits_a, loss_a), (logits_b, loss_b) = plain(idx, idx), bigram(idx, idx)
    assert torch.equal(logits_a, logits_b) and torch.equal(loss_a, loss_b)


def test_the_first_position_takes_the_no_previous_index_and_every_pair_its_own_row():
    vocab = TINY["vocab_size"]
    idx = torch.tensor([[3, 5, 5, 0], [10, 3, 5, 10]])
    rows = bigram_index(idx, vocab, bigram_rows(vocab))
    expected = torch.tensor(
        [
            [vocab * vocab + 3, 3 * vocab + 5, 5 * vocab + 5, 5 * vocab + 0],
            [vocab * vocab + 10, 10 * vocab + 3, 3 * vocab + 5, 5 * vocab + 10],
        ]
    )
    assert torch.equal(rows, expected)
    every = torch.cartesian_prod(torch.arange(vocab), torch.arange(vocab))  # (prev, token) pairs inside windows
    inside = bigram_index(every, vocab, bigram_rows(vocab))[:, 1]
    assert len(set(inside.tolist())) == vocab * vocab and inside.max() < vocab * vocab  # none is a first position's
    hashed = bigram_index(torch.randint(0, 50257, (4, 64)), 50257, BIGRAM_MAX_ROWS)
    assert hashed.min() >= 0 and hashed.max() < BIGRAM_MAX_ROWS


def test_no_token_reaches_a_position_before_it_nor_wraps_around_to_the_first():
    """No token reaches a position before it, nor wraps around to the first: causal, table included.

    Changing a window's last token changes no earlier position's logits (a rolled previous-token index would hand it to
    position 0), and position 0 reads the 'no previous' row."""
    _, model = pair()
    with torch.no_grad():
        model.transformer.bigram.weight.normal_()  # trained-like, so the table matters
    window = torch.tensor([[4, 7, 1, 2, 9]])
    changed = window.clone()
    changed[0, -1] = 3
    (a, _), (b, _) = model(window), model(changed)
    assert torch.equal(a[:, :-1], b[:, :-1]) and not torch.allclose(a[:, -1], b[:, -1])
    vocab = TINY["vocab_size"]
    assert bigram_index(window, vocab, bigram_rows(vocab))[0, 0] == vocab * vocab + 4  # (none, 4)


def test_the_table_gets_gradients_and_adamw_updates_it_without_weight_decay_never_muon(char_data):
    cfg = optimizations.validate(
        TrainConfig(
            data_dir=str(char_data), matrix_optimizer="muon", bigram_embedding=True, architecture="modern", n_layer=2
        )
    )
    raw, model, optimizer = train.build_model(cfg, 65, torch.device("cpu"))
    table = raw.transformer.bigram.weight
    assert table.shape == (66 * 65, raw.config.n_embd)
    adamw_groups = optimizer.adamw.param_groups if hasattr(optimizer, "adamw") else optimizer.param_groups
    [group] = [g for g in adamw_groups if any(p is table for p in g["params"])]
    assert group["weight_decay"] == 0.0
    if hasattr(optimizer, "muon"):
        assert not any(p is table for g in optimizer.muon.param_groups for p in g["params"])
    idx = torch.randint(0, 65, (2, 16))
    _, loss = model(idx, idx)
    loss.backward()
    used = bigram_index(idx, 65, table.shape[0]).unique()
    assert table.grad[used].abs().sum(1).gt(0).all()  # every row the batch used has a gradient, the rest none
    unused = torch.ones(table.shape[0], dtype=torch.bool)
    unused[used] = False
    assert table.grad[unused].eq(0).all()  # (two sums over the table compared exactly differ in their last bit)
    optimizer.step()
    assert table[used].abs().sum() > 0


def test_a_hugging_face_checkpoint_cannot_load_with_the_table(tmp_path):
    with pytest.raises(UserError, match="bigram_rows=4"):
        GPT.from_hf(tmp_path, bigram_rows=4)


# ---- the hashed trigram table (speedrun_10), beside the bigram one -------------------------------------------------


def trigram_pair(seed=0):
    """The model with the bigram table, and with the trigram table beside it, built from the same seed."""
    torch.manual_seed(seed)
    plain = GPT(GPTConfig(**TINY, bigram_rows=bigram_rows(TINY["vocab_size"])))
    torch.manual_seed(seed)
    tri = GPT(GPTConfig(**TINY, bigram_rows=bigram_rows(TINY["vocab_size"]), trigram_rows=TRIGRAM_ROWS))
    return plain, tri


def test_the_trigram_setting_makes_a_hashed_table_of_8192_rows():
    cfg = optimizations.validate(TrainConfig(trigram_embedding=True))
    assert TRIGRAM_ROWS == 8192 and optimizations.model_settings(cfg, "cpu", 80)["trigram_rows"] == 8192
    assert "trigram_rows" not in optimizations.model_settings(TrainConfig(), "cpu", 80)
    with pytest.raises(UserError, match="trigram_embedding must be true or false"):
        optimizations.validate(TrainConfig(trigram_embedding=1))
    with pytest.raises(UserError, match="trigram_rows must be a non-negative integer"):
        GPTConfig(**TINY, trigram_rows=-1)
    with pytest.raises(UserError, match="trigram_rows=4"):
        GPT.from_hf("/nonexistent", trigram_rows=4)


def test_the_trigram_table_starts_at_zero_and_the_first_forward_is_the_parents_exactly():
    plain, tri = trigram_pair()
    assert tri.transformer.trigram.weight.abs().sum() == 0
    idx = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    assert torch.equal(plain(idx, idx)[1], tri(idx, idx)[1])
    assert tri.num_params() == plain.num_params() + TRIGRAM_ROWS * TINY["n_embd"]
    assert tri.flops_per_token() == plain.flops_per_token()  # a lookup: no matmul


def test_the_trigram_index_reads_the_triple_ending_at_each_position_and_nothing_later():
    """The trigram index reads the triple ending at each position and nothing later.

    Each position's row depends on its own token and the two before it only (padded with the 'none' index at a window's
    start), so no token reaches an earlier position, and the same triple reads the same row."""
    vocab = TINY["vocab_size"]
    window = torch.tensor([[4, 7, 1, 2, 9, 4, 7, 1]])
    rows = trigram_index(window, vocab, TRIGRAM_ROWS)
    assert rows.min() >= 0 and rows.max() < TRIGRAM_ROWS
    assert rows[0, 2] == rows[0, 7]  # (4, 7, 1) twice
    changed = window.clone()
    changed[0, 4] = 3
    other = trigram_index(changed, vocab, TRIGRAM_ROWS)
    assert torch.equal(rows[0, :4], other[0, :4]) and torch.equal(rows[0, 7:], other[0, 7:])
    assert not torch.equal(rows[0, 4:7], other[0, 4:7])  # positions 4, 5, 6 see token 4
    _, model = trigram_pair()
    with torch.no_grad():
        model.transformer.trigram.weight.normal_()  # trained-like, so the table matters
    (a, _), (b, _) = model(window), model(changed)
    assert torch.equal(a[:, :4], b[:, :4]) and not torch.allclose(a[:, 4], b[:, 4])


def test_the_trigram_table_is_adamws_without_weight_decay_never_muons(char_data):
    cfg = optimizations.validate(
        TrainConfig(
            data_dir=str(char_data),
            matrix_optimizer="muon",
            bigram_embedding=True,
            trigram_embedding=True,
            architecture="modern",
            n_layer=2,
        )
    )
    raw, model, optimizer = train.build_model(cfg, 65, torch.device("cpu"))
    table = raw.transformer.trigram.weight
    assert table.shape == (TRIGRAM_ROWS, raw.config.n_embd)
    [group] = [g for g in optimizer.adamw.param_groups if any(p is table for p in g["params"])]
    assert group["weight_decay"] == 0.0
    assert not any(p is table for g in optimizer.muon.param_groups for p in g["params"])
    idx = torch.randint(0, 65, (2, 16))
    model(idx, idx)[1].backward()
    used = trigram_index(idx, 65, TRIGRAM_ROWS).unique()
    unused = torch.ones(TRIGRAM_ROWS, dtype=torch.bool)
    unused[used] = False
    assert table.grad[used].abs().sum(1).gt(0).all() and table.grad[unused].abs().sum() == 0  # the rows read only

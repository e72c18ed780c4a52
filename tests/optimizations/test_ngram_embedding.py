"""The bigram embedding (gpt/optimizations/ngram_embedding.py, code in gpt/model.py): it starts at zero so the first
forward is the parent's, it learns through AdamW (never Muon), a window's first position has no previous token, and
a large vocabulary is hashed into a bounded table."""

import pytest
import torch

from gpt import optimizations, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.model import GPT, GPTConfig, bigram_index
from gpt.optimizations.architecture import MODERN
from gpt.optimizations.ngram_embedding import BIGRAM_MAX_ROWS, bigram_rows

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
    """Causal, table included: changing a window's last token changes no earlier position's logits (a rolled
    previous-token index would hand it to position 0), and position 0 reads the 'no previous' row."""
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
    assert table.grad.abs().sum() == table.grad[used].abs().sum()
    optimizer.step()
    assert table[used].abs().sum() > 0


def test_a_hugging_face_checkpoint_cannot_load_with_the_table(tmp_path):
    with pytest.raises(UserError, match="bigram_rows=4"):
        GPT.from_hf(tmp_path, bigram_rows=4)

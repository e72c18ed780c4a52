"""The bigram embedding (gpt/optimizations/ngram_embedding.py, code in gpt/model.py) starts at zero and learns.

It starts at zero so the first forward is the parent's, it learns through AdamW (never Muon), a window's first position
has no previous token, and a large vocabulary is hashed into a bounded table."""

import pytest
import torch
import torch.nn.functional as F

from gpt import optimizations, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.model import GPT, GPTConfig, bigram_index, fourgram_index, trigram_index
from gpt.optimizations.architecture import MODERN
from gpt.optimizations.ngram_embedding import BIGRAM_MAX_ROWS, FOURGRAM_ROWS, TRIGRAM_ROWS, bigram_rows

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


# ---- the hashed trigram (speedrun_10) and four-gram (speedrun_17) tables, beside the bigram one --------------------

# name: (its rows, its index, the tokens it reads, its setting, the tables of the model it is added to)
HASHED = {
    "trigram": (TRIGRAM_ROWS, trigram_index, 3, "trigram_embedding", {}),
    "fourgram": (FOURGRAM_ROWS, fourgram_index, 4, "fourgram_embedding", {"trigram_rows": TRIGRAM_ROWS}),
}


def hashed_pair(name, seed=0):
    """The model the table is added to (the bigram table, and the trigram's before the four-gram), and with it."""
    rows, _, _, _, before = HASHED[name]
    tables = dict(bigram_rows=bigram_rows(TINY["vocab_size"]), **before)
    torch.manual_seed(seed)
    plain = GPT(GPTConfig(**TINY, **tables))
    torch.manual_seed(seed)
    return plain, GPT(GPTConfig(**TINY, **tables, **{f"{name}_rows": rows}))


def test_the_trigram_hash_is_the_one_speedrun_10_trained_with():
    """hashed_ngram_index's three-token case is speedrun_10's closed form, row for row (its records stay valid)."""
    idx = torch.randint(0, 65, (4, 64))
    prev, prev2 = F.pad(idx[:, :-1], (1, 0), value=65), F.pad(idx[:, :-2], (2, 0), value=65)
    closed_form = torch.bitwise_xor(torch.bitwise_xor(prev2 * 10007, prev * 36313), idx * 27191) % TRIGRAM_ROWS
    assert torch.equal(trigram_index(idx, 65, TRIGRAM_ROWS), closed_form)


@pytest.mark.parametrize("name", HASHED)
def test_a_hashed_setting_makes_its_table_and_refuses_bad_values(name):
    rows, _, _, setting, _ = HASHED[name]
    cfg = optimizations.validate(TrainConfig(**{setting: True}))
    assert optimizations.model_settings(cfg, "cpu", 80)[f"{name}_rows"] == rows
    assert f"{name}_rows" not in optimizations.model_settings(TrainConfig(), "cpu", 80)
    with pytest.raises(UserError, match=f"{setting} must be true or false"):
        optimizations.validate(TrainConfig(**{setting: 1}))
    with pytest.raises(UserError, match=f"{name}_rows must be a non-negative integer"):
        GPTConfig(**TINY, **{f"{name}_rows": -1})
    with pytest.raises(UserError, match=f"{name}_rows=4"):
        GPT.from_hf("/nonexistent", **{f"{name}_rows": 4})


def test_the_table_sizes_are_the_tried_ones():
    assert (TRIGRAM_ROWS, FOURGRAM_ROWS) == (8192, 65536)


@pytest.mark.parametrize("name", HASHED)
def test_a_hashed_table_starts_at_zero_and_the_first_forward_is_the_parents_exactly(name):
    plain, model = hashed_pair(name)
    table = model.transformer[name].weight
    assert table.abs().sum() == 0
    idx = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    assert torch.equal(plain(idx, idx)[1], model(idx, idx)[1])
    assert model.num_params() == plain.num_params() + HASHED[name][0] * TINY["n_embd"]
    assert model.flops_per_token() == plain.flops_per_token()  # a lookup: no matmul


@pytest.mark.parametrize("name", HASHED)
def test_a_hashed_index_reads_the_tokens_ending_at_each_position_and_nothing_later(name):
    """A hashed index reads the n tokens ending at each position and nothing later.

    Each position's row depends on its own token and the n - 1 before it only (the 'none' index before a window's
    start), so no token reaches an earlier position, and the same n tokens read the same row."""
    rows, index, n, _, _ = HASHED[name]
    vocab = TINY["vocab_size"]
    window = torch.tensor([[4, 7, 1, 2, 4, 7, 1, 2, 9, 5]])
    read = index(window, vocab, rows)
    assert read.min() >= 0 and read.max() < rows
    assert read[0, 3] == read[0, 7]  # (4, 7, 1, 2) twice: its last n tokens
    changed = window.clone()
    changed[0, 4] = 3
    other = index(changed, vocab, rows)
    assert torch.equal(read[0, :4], other[0, :4]) and torch.equal(read[0, 4 + n :], other[0, 4 + n :])
    assert (read[0, 4 : 4 + n] != other[0, 4 : 4 + n]).all()  # the n positions that read token 4
    _, model = hashed_pair(name)
    with torch.no_grad():
        model.transformer[name].weight.normal_()  # trained-like, so the table matters
    (a, _), (b, _) = model(window), model(changed)
    assert torch.equal(a[:, :4], b[:, :4]) and not torch.allclose(a[:, 4], b[:, 4])


@pytest.mark.parametrize("name", HASHED)
def test_a_hashed_table_is_adamws_without_weight_decay_never_muons(name, char_data):
    rows, index, _, setting, _ = HASHED[name]
    cfg = optimizations.validate(
        TrainConfig(
            data_dir=str(char_data),
            matrix_optimizer="muon",
            architecture="modern",
            n_layer=2,
            **{"bigram_embedding": True, "trigram_embedding": True, setting: True},
        )
    )
    raw, model, optimizer = train.build_model(cfg, 65, torch.device("cpu"))
    table = raw.transformer[name].weight
    assert table.shape == (rows, raw.config.n_embd)
    [group] = [g for g in optimizer.adamw.param_groups if any(p is table for p in g["params"])]
    assert group["weight_decay"] == 0.0
    assert not any(p is table for g in optimizer.muon.param_groups for p in g["params"])
    idx = torch.randint(0, 65, (2, 16))
    model(idx, idx)[1].backward()
    used = index(idx, 65, rows).unique()
    unused = torch.ones(rows, dtype=torch.bool)
    unused[used] = False
    assert table.grad[used].abs().sum(1).gt(0).all() and table.grad[unused].abs().sum() == 0  # the rows read only

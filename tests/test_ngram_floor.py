"""The speedrun's n-gram floor (gpt/ngram_floor.py): its Kneser-Ney model and how it gains from more text.

The model is a distribution over the vocabulary for every context, seen or not, and it predicts better from more text.
On a tiny excerpt: a second."""

import numpy as np
import pytest

from gpt.ngram_floor import KneserNey, prefix_sizes


def _text(n: int) -> np.ndarray:
    """Characters of a toy language: words from a small lexicon, so that longer contexts do predict."""
    rng = np.random.default_rng(0)
    words = ["the ", "king ", "shall ", "not ", "be ", "thy ", "lord ", "and ", "so "]
    text = "".join(rng.choice(words, size=n // 3))[:n]
    vocab = sorted(set("".join(words)) | {"q", "z"})  # two characters the text never has
    return np.array([vocab.index(c) for c in text]), len(vocab)


@pytest.mark.parametrize("order", [2, 5])
def test_the_probabilities_sum_to_one_over_the_vocabulary_for_any_context(order):
    tokens, vocab = _text(5000)
    model = KneserNey(tokens, vocab, order)
    contexts = [
        tokens[100 : 100 + order - 1],
        tokens[7:8],
        np.array([vocab - 1] * (order - 1)),  # seen, short, unseen
        np.array([tokens[3], vocab - 2][: order - 1]),
    ]
    for history in contexts:
        p = model.probabilities(np.tile(history, (vocab, 1)), np.arange(vocab))
        assert p.sum() == pytest.approx(1.0, abs=1e-9) and (p > 0).all()


def test_more_data_lowers_the_loss_and_a_longer_context_helps():
    tokens, vocab = _text(40_000)
    held_out = _text(60_000)[0][-2_000:].reshape(-1, 40)  # windows of the same language, not trained on
    losses = [KneserNey(tokens[:n], vocab).cross_entropy(held_out) for n in (500, 4_000, 30_000)]
    assert losses[0] > losses[1] > losses[2]
    assert KneserNey(tokens, vocab, 5).cross_entropy(held_out) < KneserNey(tokens, vocab, 2).cross_entropy(held_out)


def test_the_prefixes_double_up_to_the_whole_split():
    assert prefix_sizes(100_000) == [10_000, 20_000, 40_000, 80_000, 100_000]

"""The padded vocabulary (gpt/optimizations/padded_vocab.py, fast_4) keeps the loss and the real rows' gradients.

Without its -inf mask it would not. On the CPU, through the project's own code (tests/equivalence.py)."""

import pytest
import torch
from dist_worker import full_params
from equivalence import real_rows, report, tiny_config, train_with_grads

from gpt.data import load_prepared

# ---- padded vocabulary (fast_4) ----------------------------------------------------------------------------

# The padded model computes extra logit columns that the -inf bias removes from the softmax exactly
# (exp(-inf) = 0): the same terms in the same order. The matmul's blocking may differ with the wider output
# on other CPUs, so a float32 reassociation bound is allowed; measured here: losses and the real rows'
# gradients and parameters identical (difference 0).
PAD_RTOL, PAD_ATOL = 1e-6, 1e-8


def test_padded_vocab_keeps_the_loss_and_the_real_rows_gradients(char_data):
    vocab = load_prepared(char_data).vocab_size
    plain, grads_plain = train_with_grads(tiny_config(char_data), 3)
    padded, grads_padded = train_with_grads(tiny_config(char_data, vocab_multiple=64), 3)
    wte = padded.gpt.transformer.wte.weight
    assert wte.shape[0] == 128 > vocab  # 80 characters padded to 128 rows
    assert padded.losses == pytest.approx(plain.losses, rel=PAD_RTOL)
    for step, (gp, g) in enumerate(zip(grads_padded, grads_plain)):
        assert gp["transformer.wte.weight"][vocab:].abs().max() == 0  # padding rows: probability 0, no gradient
        report(
            f"padded vs plain vocabulary, step {step + 1} gradients (real rows)",
            real_rows(gp, vocab),
            g,
            PAD_RTOL,
            PAD_ATOL,
        )
        torch.testing.assert_close(real_rows(gp, vocab), g, rtol=PAD_RTOL, atol=PAD_ATOL)
    assert wte[vocab:].abs().max() == 0  # never predicted, never updated
    torch.testing.assert_close(
        real_rows(full_params(padded.gpt), vocab), full_params(plain.gpt), rtol=PAD_RTOL, atol=PAD_ATOL
    )


def test_padding_without_the_mask_changes_the_loss(char_data):
    """Negative control: padding without the -inf mask changes the loss.

    Without the -inf bias the padding rows' logits (0) join the softmax's denominator, so the loss the comparison above
    accepts is not reached."""
    plain = train_with_grads(tiny_config(char_data), 1)[0]
    unmasked = train_with_grads(
        tiny_config(char_data, vocab_multiple=64), 1, lambda run: setattr(run.gpt, "vocab_mask", None)
    )[0]
    print(f"\nunmasked padding vs plain loss: {unmasked.losses[0]:.6f} vs {plain.losses[0]:.6f}")
    assert unmasked.losses[0] != pytest.approx(plain.losses[0], rel=PAD_RTOL)

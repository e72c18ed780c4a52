"""Gradient accumulation (gpt/optimizations/accumulation.py, memory_1) keeps the mathematics.

Two micro-batches' gradients are the whole batch's, and the classic bugs fail that comparison. On the CPU, through the
project's own code (tests/equivalence.py: how, and how tolerances are stated)."""

import pytest
import torch
from equivalence import NO_CLIP, report, tiny_config, train_with_grads

# ---- gradient accumulation (memory_1) --------------------------------------------------------------------

# Two micro-batch means over 16 samples, each halved, summed, vs one mean over 32: the same terms added
# in another order (float32 reassociation, ~1e-7 relative per sum). Step 1 compares gradients at the
# same weights (measured max 3e-8); step 2's weights already carry step 1's rounding, which AdamW
# amplifies where a gradient is tiny (measured max 1.1e-7, entries up to ~0.15). The bound is 5x that;
# the broken patterns below exceed it ~5e4-fold. Clipping is off (NO_CLIP): it would rescale both sides to
# norm 1 and so hide a wrong scale, such as micro-batch losses not divided by their number.
ACCUM_RTOL, ACCUM_ATOL = 1e-5, 5e-7


def test_grad_accumulation_x2_gives_the_gradients_of_the_whole_batch(char_data):
    # Dropout 0: a dropout mask is drawn per forward call, so two micro-batches of 16 would get other
    # masks than one batch of 32 and no gradient could match.
    cfg = dict(batch_size=32, grad_clip=NO_CLIP)
    one, grads_one = train_with_grads(tiny_config(char_data, **cfg), 2)
    two, grads_two = train_with_grads(tiny_config(char_data, grad_accum_steps=2, **cfg), 2)
    assert all(torch.equal(a, b) for a, b in zip(one.inputs, two.inputs))  # the same 32 samples per step
    for step, (g2, g1) in enumerate(zip(grads_two, grads_one)):
        report(f"accumulation x2 vs batch 32, step {step + 1} gradients", g2, g1, ACCUM_RTOL, ACCUM_ATOL)
        torch.testing.assert_close(g2, g1, rtol=ACCUM_RTOL, atol=ACCUM_ATOL)
    assert two.losses == pytest.approx(one.losses, rel=1e-6)


def zero_grad_per_micro_batch(run):
    """The reference's bug: gradients reset inside the micro-batch loop.

    Here: before every micro-batch forward of the real train_step; so only the last micro-batch, halved, reaches the
    optimizer."""
    run.model.register_forward_pre_hook(lambda module, args: run.optimizer.zero_grad(set_to_none=True))


def loss_not_divided(run):
    """The other classic bug: micro-batch losses summed, not averaged (undoes train_step's `/ k`, k = 2)."""
    run.model.register_forward_hook(lambda module, args, out: (out[0], out[1] * 2))


@pytest.mark.parametrize("bug", [zero_grad_per_micro_batch, loss_not_divided])
def test_broken_accumulation_fails_that_comparison(bug, char_data):
    """Negative controls: the comparison above rejects a broken accumulation."""
    cfg = dict(batch_size=32, grad_clip=NO_CLIP)
    _, grads_one = train_with_grads(tiny_config(char_data, **cfg), 1)
    _, grads_bug = train_with_grads(tiny_config(char_data, grad_accum_steps=2, **cfg), 1, bug)
    report(f"{bug.__name__} vs batch 32 gradients", grads_bug[0], grads_one[0], ACCUM_RTOL, ACCUM_ATOL)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(grads_bug[0], grads_one[0], rtol=ACCUM_RTOL, atol=ACCUM_ATOL)

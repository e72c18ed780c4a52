"""Activation checkpointing (gpt/optimizations/checkpointing.py, memory_2) keeps the mathematics.

The recomputed blocks give the plain blocks' gradients to the bit, dropout included, and their recomputation raises no
exception through an op. On the CPU, through the project's own code (tests/equivalence.py)."""

import torch
from equivalence import max_diff, report, seeded, tiny_config, train_with_grads
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

# ---- activation checkpointing (memory_2) -----------------------------------------------------------------


def test_activation_checkpointing_gives_identical_gradients_with_dropout(char_data):
    """Activation checkpointing gives the plain blocks' gradients to the bit, dropout included.

    Tolerance 0: the recomputed forward runs the same kernels on the same inputs, and checkpointing restores the RNG
    state before it, so dropout draws the same masks again."""
    cfg = dict(dropout=0.1, grad_accum_steps=2)  # as memory_2 runs: after the accumulation stage
    plain, grads_plain = train_with_grads(tiny_config(char_data, **cfg), 2, seeded(1))
    ckpt, grads_ckpt = train_with_grads(tiny_config(char_data, activation_checkpointing=True, **cfg), 2, seeded(1))
    assert all(isinstance(b, CheckpointWrapper) for b in ckpt.gpt.transformer.h)
    for step, (gc, gp) in enumerate(zip(grads_ckpt, grads_plain)):
        report(f"checkpointing vs plain, step {step + 1} gradients", gc, gp)
        torch.testing.assert_close(gc, gp, rtol=0, atol=0)
    assert ckpt.losses == plain.losses
    # Control: dropout is really on, i.e. other masks would have failed the comparison.
    _, grads_other = train_with_grads(tiny_config(char_data, **cfg), 1, seeded(2))
    assert max_diff(grads_other[0], grads_plain[0])[1] > 1e-3


def with_pytorchs_early_stop(raw) -> None:
    """Checkpoint raw's blocks again with PyTorch's default (early stop on): the control of the tests below."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = raw.transformer.h
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block._checkpoint_wrapped_module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def test_checkpoint_recomputation_raises_no_exception_through_an_op(char_data, monkeypatch):
    """The checkpointed blocks' recomputation raises no exception through an op.

    memory_2 recomputes each block whole (early_stop=False, gpt/optimizations/checkpointing.py): with early stop,
    PyTorch ends a recomputation by raising an exception from inside the block's last op that saves a tensor (the MLP's
    dropout), which torch 2.11 loses on CUDA while the allocator records its history (the H100 memory step crashed
    there). Counted: none in a checkpointed step. Control: the same blocks with PyTorch's default raise one per block
    and micro-batch."""
    import torch.utils.checkpoint as ckpt_module

    raised = []
    init = ckpt_module._StopRecomputationError.__init__
    monkeypatch.setattr(
        ckpt_module._StopRecomputationError, "__init__", lambda self, *a: raised.append(1) or init(self, *a)
    )
    cfg = tiny_config(char_data, dropout=0.1, grad_accum_steps=2, activation_checkpointing=True)
    _, (grads,) = train_with_grads(cfg, 1, seeded(1))
    assert raised == []

    _, (grads_early,) = train_with_grads(cfg, 1, seeded(1), lambda run: with_pytorchs_early_stop(run.gpt))
    assert len(raised) == cfg.n_layer * cfg.grad_accum_steps
    torch.testing.assert_close(grads, grads_early, rtol=0, atol=0)  # the same saved tensors either way

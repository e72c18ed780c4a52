"""AdamW's implementations (gpt/optimizations/adamw.py) step as the reference's multi-tensor (foreach) path does.

The per-parameter for-loop (memory_3) to the bit, the fused kernel (fast_5) to float32 rounding. On the CPU, through
the project's own code (tests/equivalence.py)."""

import pytest
import torch
from dist_worker import full_params, run_steps
from equivalence import report, tiny_config, train_with_grads

# ---- AdamW foreach off (memory_3) ------------------------------------------------------------------------


def test_adamw_for_loop_matches_foreach(char_data):
    """AdamW's per-parameter for-loop steps as its multi-tensor (foreach) path does, to the bit.

    Tolerance 0 on parameters and both moments after 4 steps: the per-parameter loop and the multi-tensor kernels do
    the same elementwise operations in the same order."""
    cfg = dict(lr=3e-3)  # every step moves every weight by ~lr, far above float32 resolution
    multi = run_steps(tiny_config(char_data, optimizer_foreach=True, **cfg), steps=4)
    loop = run_steps(tiny_config(char_data, optimizer_foreach=False, **cfg), steps=4)
    assert [g["foreach"] for g in loop.optimizer.param_groups] == [False, False]
    assert [g["foreach"] for g in multi.optimizer.param_groups] == [True, True]
    assert [g["weight_decay"] for g in loop.optimizer.param_groups] == [0.1, 0.0]  # both groups in play
    report("AdamW for-loop vs foreach parameters after 4 steps", full_params(loop.gpt), full_params(multi.gpt))
    torch.testing.assert_close(full_params(loop.gpt), full_params(multi.gpt), rtol=0, atol=0)
    for p_loop, p_multi in zip(loop.gpt.parameters(), multi.gpt.parameters()):
        s_loop, s_multi = loop.optimizer.state[p_loop], multi.optimizer.state[p_multi]
        torch.testing.assert_close(s_loop["exp_avg"], s_multi["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(s_loop["exp_avg_sq"], s_multi["exp_avg_sq"], rtol=0, atol=0)
    assert loop.losses == multi.losses


# ---- fused AdamW (fast_5) ----------------------------------------------------------------------------------

# The fused kernel computes the same update in one pass, but divides and takes the square root in another
# order (and with FMAs): float32 rounding of ~1e-7 relative per step. Adam amplifies it where a gradient is
# pure rounding noise: the attention's key bias has a true gradient of 0 (softmax ignores a constant added to
# all of a query's scores), its float gradients are ~1e-10, and m / (sqrt(v) + eps) with eps 1e-8 turns
# their differences into update differences. Measured after 4 steps at lr 3e-3: max |diff| 1.1e-6, on a key
# bias entry; elsewhere ~1e-8. Bound 1e-5, 0.3% of one step's move (lr): a wrong update moves weights by ~lr.
FUSED_RTOL, FUSED_ATOL = 1e-5, 1e-5


def test_fused_adamw_matches_foreach(char_data):
    cfg = dict(lr=3e-3)
    foreach = train_with_grads(tiny_config(char_data, **cfg), 4)[0]
    fused = train_with_grads(tiny_config(char_data, optimizer_fused=True, **cfg), 4)[0]
    assert [g["fused"] for g in fused.optimizer.param_groups] == [True, True]
    report(
        "fused vs foreach AdamW, parameters after 4 steps",
        full_params(fused.gpt),
        full_params(foreach.gpt),
        FUSED_RTOL,
        FUSED_ATOL,
    )
    torch.testing.assert_close(full_params(fused.gpt), full_params(foreach.gpt), rtol=FUSED_RTOL, atol=FUSED_ATOL)
    assert fused.losses == pytest.approx(foreach.losses, rel=1e-6)

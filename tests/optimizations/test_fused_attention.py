"""Fused attention (gpt/optimizations/fused_attention.py, fast_3): SDPA matches the explicit attention.

A run for time keeps the explicit one where SDPA was measured slower (a run for memory keeps SDPA). On the CPU, through
the project's own code (tests/equivalence.py)."""

import pytest
import torch
from equivalence import CPU, built_model_config, report, tiny_config, train_with_grads

from gpt.optimizations import owner

# ---- fused attention (fast_3) ------------------------------------------------------------------------------

# SDPA's CPU kernel computes the softmax blockwise with an online maximum and sums in another order: float32
# reassociation. Measured: losses equal to ~1e-7, gradients within ~1e-8 (~1e-7 of the largest). The bound
# leaves >10x. Dropout 0: the fused kernel draws its masks differently.
SDPA_RTOL, SDPA_ATOL = 1e-5, 1e-6


def test_sdpa_matches_naive_attention(char_data):
    # goal "memory": the model computes with the attention its config names. A run for time would choose by a timing
    # of this machine (attention_used), and where SDPA measured slower both runs would be the explicit attention.
    naive, grads_naive = train_with_grads(tiny_config(char_data, attention="naive", goal="memory"), 2)
    sdpa, grads_sdpa = train_with_grads(tiny_config(char_data, attention="sdpa", goal="memory"), 2)
    assert sdpa.gpt.transformer.h[0].attn.attention == "sdpa"
    assert sdpa.losses == pytest.approx(naive.losses, rel=SDPA_RTOL)
    for step, (gs, gn) in enumerate(zip(grads_sdpa, grads_naive)):
        report(f"sdpa vs naive, step {step + 1} gradients", gs, gn, SDPA_RTOL, SDPA_ATOL)
        torch.testing.assert_close(gs, gn, rtol=SDPA_RTOL, atol=SDPA_ATOL)


def test_a_run_for_time_keeps_the_explicit_attention_where_sdpa_was_measured_slower(char_data, monkeypatch):
    """A run for time keeps the explicit attention where SDPA was measured slower.

    fast_3's CPU rule: SDPA only where one forward and backward of it was measured faster at the stage's shape and
    precision; otherwise the explicit attention, and the record's no_effect gives both times. The measurement is kept
    (gpt/machine_cache.py) and leaves the random state alone. A GPU follows the same rule, measured there."""
    from gpt.optimizations import fused_attention

    calls = []

    def measured(*shape):
        calls.append(shape)
        return [1.0, 4.0]

    monkeypatch.setattr(fused_attention, "time_attentions", measured)
    cfg = tiny_config(char_data, attention="sdpa", block_size=24, batch_size=6, samples=60)  # a shape of its own
    choice, why = fused_attention.attention_used(cfg, "cpu")
    reason = owner("attention").no_effect(cfg, CPU)
    assert choice == "naive" and why == reason
    assert reason.startswith("kept the explicit attention: SDPA is slower on this CPU at this shape")
    assert "6 x 2 heads x 24 positions x 16, float32: explicit 1.00 ms, SDPA 4.00 ms" in reason
    assert len(calls) == 1  # measured once, then read from the cache
    # a GPU measures too, apart from the CPU and under its own name
    monkeypatch.setattr(fused_attention, "device_label", lambda device: "GPU (H200)")
    choice, why = fused_attention.attention_used(cfg, "cuda")
    assert choice == "naive" and "slower on this GPU (H200)" in why and len(calls) == 2
    assert calls[-1][-1] == torch.device("cuda")
    monkeypatch.setattr(fused_attention, "time_attentions", lambda *shape: [4.0, 1.0])
    faster = tiny_config(char_data, attention="sdpa", block_size=20, batch_size=5, samples=60)
    assert fused_attention.attention_used(faster, "cpu") == ("sdpa", None)
    assert owner("attention").no_effect(faster, CPU) is None
    assert built_model_config(faster).attention == "sdpa" and built_model_config(cfg).attention == "naive"


def test_the_attention_benchmark_leaves_the_random_state_alone():
    """The attention benchmark leaves the random state alone.

    A stage measures the attentions while building its model, right after seeding it: the weights must be the seed's,
    whatever the benchmark drew (it uses the random generator and dropout)."""
    from gpt.optimizations.fused_attention import time_attentions

    torch.manual_seed(0)
    state = torch.get_rng_state()
    times = time_attentions(2, 2, 8, 4, torch.float32, 0.1, compiled=False)
    assert torch.equal(torch.get_rng_state(), state) and all(t > 0 for t in times)


def test_a_run_for_memory_keeps_sdpa_whatever_its_time(char_data, monkeypatch):
    from gpt.optimizations import fused_attention

    monkeypatch.setattr(fused_attention, "time_attentions", lambda *shape: [1.0, 4.0])
    cfg = tiny_config(char_data, attention="sdpa", block_size=28, batch_size=4, samples=40, goal="memory")
    assert fused_attention.attention_used(cfg, "cpu") == ("sdpa", None)

"""The stages beyond the book (the fast_* and lean_* ladders) keep the mathematics of training: each is
checked against its parent here, on the CPU, through the project's own code, in the style of
tests/test_ladder_equivalence.py (whose helpers it uses). Tolerances are stated per test; measured
differences are printed (pytest -s).
"""

import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import needs_torch_chunked_loss
from dist_worker import full_params, param_name
from test_ladder_equivalence import (
    AMP_LOSS_ATOL,
    CPU,
    DIST_GRAD_ATOL,
    DIST_GRAD_RTOL,
    DIST_PARAM_ATOL,
    DIST_PARAM_RTOL,
    DIST_STEPS,
    NO_CLIP,
    NPROC,
    RANK_BATCH,
    build_model,
    check_two_processes_match_one,
    fake_process_group,
    fsdp_units,
    global_norm,
    gpt2_text_data,  # noqa: F401 (a fixture)
    launch_workers,
    loader_batches,
    max_diff,
    report,
    tiny_config,
    train_with_grads,
)

from gpt.data import load_prepared, make_dataset
from gpt.errors import UserError
from gpt.ladder import STAGES_DIR, stage_config
from gpt.optimizations import chunked_loss, owner, why_cannot_run
from gpt.optimizations.parallel import fsdp_policies
from gpt.optimizations.precision import matmul_precision, mixed_precision
from gpt.stage import EXIT_SKIPPED, no_effect

# ---- pre-tokenised data (fast_1) ---------------------------------------------------------------------------


def test_char_token_windows_are_the_raw_text_windows(char_data):
    """Tolerance 0: with the character tokenizer, token i is character i of the cleaned text, so sample i
    of the memory-mapped token file is sample i of the per-sample text pipeline."""
    raw = make_dataset("raw_text", char_data, 32)
    tokens = make_dataset("tokens", char_data, 32)
    for i in torch.randint(min(len(raw), len(tokens)), (200,), generator=torch.Generator().manual_seed(0)).tolist():
        (xr, yr), (xt, yt) = raw[i], tokens[i]
        assert torch.equal(xr, xt) and torch.equal(yr, yt), i


def test_gpt2_token_windows_and_raw_text_windows_come_from_the_same_text(gpt2_text_data):
    """With GPT-2's BPE a raw-text window starts at a character and a token window at a token, so they are
    not the same windows; both are windows of the same cleaned text (decoded, each is a piece of it)."""
    prepared = load_prepared(gpt2_text_data)
    text = prepared.text_path("train").read_text()
    raw, tokens = make_dataset("raw_text", gpt2_text_data, 32), make_dataset("tokens", gpt2_text_data, 32)
    decode = prepared.tokenizer.decode
    g = torch.Generator().manual_seed(0)
    for dataset in (raw, tokens):
        for i in torch.randint(len(dataset), (50,), generator=g).tolist():
            x, y = dataset[i]
            assert torch.equal(x[1:], y[:-1])  # next-token targets in both
            # a window may start in the middle of a multi-byte character: drop its first token's text
            assert decode(x[1:].tolist()) in text


# ---- bf16 without a scaler, TF32 (fast_2): no effect on a CPU -----------------------------------------------


def test_bf16_stage_changes_nothing_on_a_cpu(char_data, monkeypatch):
    """On the CPU autocast is bf16 (or fp32) without a scaler whether amp_bf16 is on or not, and TF32 does
    not exist: the stage runs the same code, and its record says why (and the next stage's, with SDPA measured
    faster, says nothing)."""
    from gpt.optimizations import fused_attention

    monkeypatch.setattr(fused_attention, "measured_attention_choice", lambda cfg, device_type: ("sdpa", None))
    before, after = tiny_config(char_data, amp=True), tiny_config(char_data, amp=True, amp_bf16=True, tf32=True)
    assert mixed_precision(after, CPU) == mixed_precision(before, CPU)
    assert matmul_precision(after, CPU) == "fp32"
    reason = no_effect("fast_2_bf16", "smoke", stage_config("fast_2_bf16", "smoke", device="cpu"))
    assert reason.startswith("no effect on cpu: ") and "GradScaler" in reason and "TF32" in reason
    assert no_effect("fast_3_sdpa", "smoke", stage_config("fast_3_sdpa", "smoke", device="cpu")) is None


# fast_2's mathematics, run on the CPU with what mixed_precision chooses for an Ampere GPU: bf16 autocast, no scaler.
# bf16 keeps 8 significant bits, so each cast to it moves a value by at most u = 2^-8 (unit roundoff) relative. The
# gradient of block 0's weights crosses the 8 matmuls after it (block 1's attention: qkv, q k^T, att v, proj; its
# MLP: 2; the head) forward and backward: ~3 roundings per matmul each way (two inputs, one output), n ~ 48.
# Independent roundings add in quadrature: sqrt(48) u ~ 2.7e-2 of a tensor's largest gradient (worst case, all in
# line: 48 u ~ 0.19). Measured at step 1: 7.0e-3 (1.8 u). Clipping off: a loss scale left in the gradients
# (x2 or more) would otherwise be clipped away; Adam divides a scale out, so the gradients are the check of it.
BF16_GRAD_RTOL = 48**0.5 * 2**-8


def test_bf16_without_a_scaler_trains_like_fp32(char_data, monkeypatch):
    """fast_2's choice on a GPU with bf16 units computes in bf16 (not fp16: fp16 without a scaler underflows small
    gradients at scale; on this tiny model it is closer to fp32 than bf16 is, so the dtype is the check) and scales
    nothing (a GradScaler left on gives the same bits, its power-of-2 scale is exact in bf16, but keeps its host
    sync: the choice is the check); run on the CPU, its first step's gradients match fp32's within BF16_GRAD_RTOL and
    its losses within speed_5's AMP_LOSS_ATOL."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # an A100's answer
    chosen = mixed_precision(tiny_config(char_data, amp=True, amp_bf16=True, device="cuda"), torch.device("cuda"))
    assert chosen.dtype == torch.bfloat16 and chosen.scaler is None, chosen
    amp = dataclasses.replace(chosen, device_type="cpu")  # the same autocast, on this CPU
    cfg = dict(lr=3e-3, grad_clip=NO_CLIP)
    fp32, grads_fp32 = train_with_grads(tiny_config(char_data, **cfg), 3)
    bf16, grads_bf16 = train_with_grads(tiny_config(char_data, amp=True, amp_bf16=True, **cfg), 3, amp=amp)
    with torch.no_grad(), amp.autocast():  # the matmuls really ran in bf16
        assert bf16.model(bf16.inputs[0])[0].dtype == torch.bfloat16
    report("fast_2 (bf16, no scaler) vs fp32, step 1 gradients", grads_bf16[0], grads_fp32[0])
    assert max_diff(grads_bf16[0], grads_fp32[0])[1] < BF16_GRAD_RTOL
    assert max(abs(a - b) for a, b in zip(bf16.losses, fp32.losses)) < AMP_LOSS_ATOL


def test_cpu_keeps_fp32_where_bf16_is_slower(monkeypatch, char_data):
    """speed_5_amp's CPU rule: autocast to bf16 only where bf16 matmuls were measured faster than fp32."""
    rates = {torch.float32: 300e9, torch.bfloat16: 150e9}  # a CPU with AVX512-BF16 but no AMX
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_flops", lambda dtype: rates[dtype])
    amp = mixed_precision(tiny_config(char_data, amp=True), CPU)
    assert amp.dtype == torch.float32 and amp.scaler is None and "bf16 150.0, fp32 300.0 GFLOP/s" in amp.why
    assert owner("amp").no_effect(tiny_config(char_data, amp=True), CPU) == amp.why
    rates[torch.bfloat16] = 2400e9  # a CPU with AMX
    assert mixed_precision(tiny_config(char_data, amp=True), CPU).dtype == torch.bfloat16
    assert owner("amp").no_effect(tiny_config(char_data, amp=True), CPU) is None


# ---- fused attention (fast_3) ------------------------------------------------------------------------------

# SDPA's CPU kernel computes the softmax blockwise with an online maximum and sums in another order: float32
# reassociation. Measured: losses equal to ~1e-7, gradients within ~1e-8 (~1e-7 of the largest). The bound
# leaves >10x. Dropout 0: the fused kernel draws its masks differently.
SDPA_RTOL, SDPA_ATOL = 1e-5, 1e-6


def test_sdpa_matches_naive_attention(char_data):
    naive, grads_naive = train_with_grads(tiny_config(char_data, attention="naive"), 2)
    sdpa, grads_sdpa = train_with_grads(tiny_config(char_data, attention="sdpa"), 2)
    assert sdpa.raw.transformer.h[0].attn.attention == "sdpa"
    assert sdpa.losses == pytest.approx(naive.losses, rel=SDPA_RTOL)
    for step, (gs, gn) in enumerate(zip(grads_sdpa, grads_naive)):
        report(f"sdpa vs naive, step {step + 1} gradients", gs, gn, SDPA_RTOL, SDPA_ATOL)
        torch.testing.assert_close(gs, gn, rtol=SDPA_RTOL, atol=SDPA_ATOL)


# ---- padded vocabulary (fast_4) ----------------------------------------------------------------------------

# The padded model computes extra logit columns that the -inf bias removes from the softmax exactly
# (exp(-inf) = 0): the same terms in the same order. The matmul's blocking may differ with the wider output
# on other CPUs, so a float32 reassociation bound is allowed; measured here: losses and the real rows'
# gradients and parameters identical (difference 0).
PAD_RTOL, PAD_ATOL = 1e-6, 1e-8


def real_rows(grads: dict, vocab: int) -> dict:
    return {k: (g[:vocab] if k == "transformer.wte.weight" else g) for k, g in grads.items()}


def test_padded_vocab_keeps_the_loss_and_the_real_rows_gradients(char_data):
    vocab = load_prepared(char_data).vocab_size
    plain, grads_plain = train_with_grads(tiny_config(char_data), 3)
    padded, grads_padded = train_with_grads(tiny_config(char_data, vocab_multiple=64), 3)
    wte = padded.raw.transformer.wte.weight
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
        real_rows(full_params(padded.raw), vocab), full_params(plain.raw), rtol=PAD_RTOL, atol=PAD_ATOL
    )


def test_padding_without_the_mask_changes_the_loss(char_data):
    """Negative control: without the -inf bias the padding rows' logits (0) join the softmax's denominator,
    so the loss the comparison above accepts is not reached."""
    plain = train_with_grads(tiny_config(char_data), 1)[0]
    unmasked = train_with_grads(
        tiny_config(char_data, vocab_multiple=64), 1, lambda run: setattr(run.raw, "vocab_mask", None)
    )[0]
    print(f"\nunmasked padding vs plain loss: {unmasked.losses[0]:.6f} vs {plain.losses[0]:.6f}")
    assert unmasked.losses[0] != pytest.approx(plain.losses[0], rel=PAD_RTOL)


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
        full_params(fused.raw),
        full_params(foreach.raw),
        FUSED_RTOL,
        FUSED_ATOL,
    )
    torch.testing.assert_close(full_params(fused.raw), full_params(foreach.raw), rtol=FUSED_RTOL, atol=FUSED_ATOL)
    assert fused.losses == pytest.approx(foreach.losses, rel=1e-6)


# ---- chunked linear + cross-entropy (fast_6, lean_2) --------------------------------------------------------

# The chunked op sums the loss chunk by chunk and accumulates the head's weight gradient over chunks: the
# same sums in another order. Measured (fp32): losses within ~2e-7 relative, gradients within ~1e-7 absolute
# (<2e-6 of the largest).
CHUNK_RTOL, CHUNK_ATOL = 1e-5, 1e-7


# The chunked op adds each chunk's weight gradient into a buffer of the input's dtype (bf16 under autocast), on the
# CPU and on CUDA alike: the more chunks, the further from fp32. At fast_6's reference shape (128 chunks) its
# relative difference from fp32 was 2.6e-2 against 3.4e-3 for the bf16 full loss: the bound for the chunked loss's
# extra difference (test_bf16_chunked_weight_gradient_at_the_stages_shape measures it).
BF16_CHUNKED_WEIGHT_GRAD = 3e-2


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 16 rows, so the tests' 8 x 16 = 128 rows per step are 8 chunks; the chunked path pinned. A run for
    time on a CPU (tiny_config's goal) keeps the loss measured faster at its shape (chunked_loss.loss_used): on this
    CPU the full one, so without the pin both sides would compute the full loss, and the spy would count the
    measurement's own calls. Returns the spy's calls (each call's chunk size)."""
    monkeypatch.setattr(chunked_loss, "LOSS_CHUNK_ROWS", 16)
    monkeypatch.setattr(chunked_loss, "measured_loss_choice", lambda cfg, vocab_size, device_type: ("chunked", None))
    monkeypatch.setattr(chunked_loss, "time_head_and_loss", None)  # nothing measures: every call is training's
    calls = []
    real = torch.nn.functional.linear_cross_entropy

    @functools.wraps(real)  # the op's signature: chunked_loss.installed("torch") checks it
    def spy(*args, **kwargs):
        calls.append(kwargs["options"].batch_chunk_size)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", spy)
    return calls


@needs_torch_chunked_loss
@pytest.mark.parametrize("vocab_multiple", [1, 64])
def test_chunked_loss_matches_the_full_loss(small_chunks, char_data, vocab_multiple):
    full, grads_full = train_with_grads(tiny_config(char_data, vocab_multiple=vocab_multiple), 2)
    chunked, grads_chunked = train_with_grads(tiny_config(char_data, vocab_multiple=vocab_multiple, loss="chunked"), 2)
    assert chunked.raw.config.loss == "chunked" and full.raw.config.loss == "full"
    assert small_chunks == [16, 16]  # the chunked op ran in the model, once per step, 8 chunks per call
    assert chunked.losses == pytest.approx(full.losses, rel=CHUNK_RTOL)
    for step, (gc, gf) in enumerate(zip(grads_chunked, grads_full)):
        report(
            f"chunked vs full loss (vocab_multiple {vocab_multiple}), step {step + 1} gradients",
            gc,
            gf,
            CHUNK_RTOL,
            CHUNK_ATOL,
        )
        torch.testing.assert_close(gc, gf, rtol=CHUNK_RTOL, atol=CHUNK_ATOL)


@needs_torch_chunked_loss
def test_chunked_loss_under_bf16_autocast_tracks_fp32_as_closely_as_the_full_loss(small_chunks, monkeypatch, char_data):
    """Under bf16 autocast both losses multiply in bf16; the full loss then computes its softmax in fp32, the
    chunked op (on a CPU) in the inputs' dtype, and it returns the loss in bf16, summed over chunks in bf16.
    So: gradients as close to fp32 training as the full loss's are (bound: twice the full loss's difference
    plus BF16_CHUNKED_WEIGHT_GRAD of the largest gradient; measured ~7e-3 for both here), and the loss within its
    bf16 summation error (n_chunks half-ulps, 2^-9 relative each)."""
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_flops", lambda dtype: 2.0 if dtype == torch.bfloat16 else 1.0)
    cfg = dict(grad_clip=NO_CLIP)
    fp32, grads_fp32 = train_with_grads(tiny_config(char_data, **cfg), 1)
    full, grads_full = train_with_grads(tiny_config(char_data, amp=True, **cfg), 1)
    chunked, grads_chunked = train_with_grads(tiny_config(char_data, amp=True, loss="chunked", **cfg), 1)
    assert chunked.raw.config.loss == "chunked" and small_chunks == [16]
    n_chunks = 8 * 16 // small_chunks[0]
    full_rel, chunked_rel = max_diff(grads_full[0], grads_fp32[0])[1], max_diff(grads_chunked[0], grads_fp32[0])[1]
    print(
        f"\nbf16 vs fp32 gradients, max |diff| / max |value|: full loss {full_rel:.3g}, chunked {chunked_rel:.3g}; "
        f"losses: fp32 {fp32.losses[0]:.5f}, full {full.losses[0]:.5f}, chunked {chunked.losses[0]:.5f}"
    )
    assert chunked_rel < 2 * full_rel + BF16_CHUNKED_WEIGHT_GRAD
    assert chunked.losses[0] == pytest.approx(fp32.losses[0], rel=n_chunks * 2**-9 + 2e-3)


# Which implementation computes the chunked loss (gpt/optimizations/chunked_loss.py), and the glue around the two
# that need Triton (CUDA only): each gets its inputs as the chunked op's contract says. A stand-in with the library's
# signature computes what the library documents (below), so the glue must reproduce the full loss exactly (same ops,
# same order).


def fake_module(monkeypatch, name: str, **attributes):
    """A module importable as `name` (find_spec included) with the given attributes."""
    import importlib.machinery
    import types

    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        module = types.ModuleType(".".join(parts[:i]))
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        monkeypatch.setitem(sys.modules, module.__name__, module)
    for key, value in attributes.items():
        setattr(sys.modules[name], key, value)


def test_chunked_loss_implementation_follows_what_is_installed(monkeypatch):
    """auto: PyTorch's own op where it exists (2.12 and newer), else liger, else Cut Cross-Entropy, both on
    CUDA only; with none, a stage records why it is skipped; a named implementation that is missing says what
    to install."""

    def skip_reason(stage):
        return why_cannot_run(stage_config(stage, "smoke", device="cpu"), "cpu")

    installed = set()  # the libraries this test says are installed, whatever this machine has
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in installed else None)

    def op(input, linear_weight, target, *, linear_bias=None, options=None): ...  # the signature called

    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", op, raising=False)
    assert chunked_loss.resolve("auto", "cpu") == chunked_loss.resolve("auto", "cuda") == "torch"
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy")  # as in torch 2.11
    with pytest.raises(UserError, match="on a cpu needs PyTorch 2.12 or newer"):
        chunked_loss.resolve("auto", "cpu")
    with pytest.raises(UserError, match="pip install liger-kernel"):
        chunked_loss.resolve("auto", "cuda")
    with pytest.raises(UserError, match="`pip install cut-cross-entropy`"):
        chunked_loss.resolve("cce", "cuda")
    assert skip_reason("lean_2_chunked_loss").startswith("the chunked loss on a cpu needs PyTorch 2.12")
    assert skip_reason("fast_6_chunked_loss") is None  # a run for time computes the full loss instead
    assert skip_reason("fast_5_fused_adamw") is None
    installed.add("cut_cross_entropy")
    assert chunked_loss.resolve("auto", "cuda") == "cce"
    assert chunked_loss.why_unavailable("cce", "cpu") == "the chunked loss 'cce' runs on CUDA only (Triton kernels)"
    installed.add("liger_kernel")
    assert chunked_loss.resolve("auto", "cuda") == "liger" and chunked_loss.resolve("cce", "cuda") == "cce"


# Stand-ins for the two Triton kernels: each library's own signature (liger-kernel 0.8.5,
# liger_kernel/transformers/functional.py; cut-cross-entropy 25.1.1, cut_cross_entropy/linear_cross_entropy.py),
# computing what it documents, so that the glue's mistakes change the loss: logits = input @ weight.T (+ bias; weight
# is (vocab, dim)) in the inputs' dtype, which must match (a Triton kernel is not reached by autocast, so the stand-in
# turns it off), soft-capped, then fp32 cross-entropy with ignore_index and the reduction (liger: class weights, label
# smoothing, z-loss; cce: shift, the next row's target). What they cannot show on a CPU, the rounding that liger's
# accum_dtype and cce's gradient filter change, is recorded and checked as given.


def kernel_contract(
    x,
    weight,
    targets,
    bias=None,
    *,
    ignore_index,
    reduction,
    softcap,
    ce_weight=None,
    label_smoothing=0.0,
    lse_square_scale=0.0,
):
    assert x.dim() == 2 and targets.shape == x.shape[:1] and weight.shape[1] == x.shape[1]
    with torch.autocast(x.device.type, enabled=False):
        logits = torch.nn.functional.linear(x, weight, bias)  # raises unless x, weight and bias share a dtype
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits,
        targets,
        weight=ce_weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    if lse_square_scale:
        z = lse_square_scale * torch.logsumexp(logits, -1)[targets != ignore_index] ** 2
        loss = loss + {"mean": z.mean(), "sum": z.sum()}[reduction]
    return loss


def stand_ins(monkeypatch) -> dict:
    """Both libraries importable, with the stand-ins; returns what the precision-only arguments were given."""
    seen = {}

    def liger_fused_linear_cross_entropy(
        input,
        weight,
        target,
        bias=None,
        ce_weight=None,
        ignore_index=-100,
        lse_square_scale=0.0,
        label_smoothing=0.0,
        reduction="mean",
        softcap=None,
        return_z_loss=False,
        accum_dtype=None,
        use_token_scaling=False,
        return_token_accuracy=False,
        return_predicted_tokens=False,
        chunk_mem_const=1,
    ):
        assert not (return_z_loss or use_token_scaling or return_token_accuracy or return_predicted_tokens)  # a tuple
        seen.update(accum_dtype=accum_dtype)
        return kernel_contract(
            input,
            weight,
            target,
            bias,
            ignore_index=ignore_index,
            reduction=reduction,
            softcap=softcap,
            ce_weight=ce_weight,
            label_smoothing=label_smoothing,
            lse_square_scale=lse_square_scale,
        )

    def linear_cross_entropy(
        e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False, filter_eps="high", impl="cce"
    ):
        seen.update(filter_eps=filter_eps, impl=impl)
        if shift:
            e, targets = e[:-1], targets[1:]
        return kernel_contract(e, c, targets, ignore_index=ignore_index, reduction=reduction, softcap=softcap)

    fake_module(
        monkeypatch,
        "liger_kernel.transformers.functional",
        liger_fused_linear_cross_entropy=liger_fused_linear_cross_entropy,
    )
    fake_module(monkeypatch, "cut_cross_entropy", linear_cross_entropy=linear_cross_entropy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["liger", "cce"])
def test_triton_chunked_losses_get_the_padded_head_as_their_contract_says(impl, dtype, monkeypatch):
    """liger takes the -inf padding bias (and fp32 weight-gradient accumulation); Cut Cross-Entropy takes no
    bias, so it gets the real rows only, with its gradient filtering off; under autocast both get the autocast
    dtype's inputs, bias included. Either way: the full loss of the padded head, as the model computes it under the
    same autocast, its gradients to the bit, and gradient 0 for the padding rows."""
    seen = stand_ins(monkeypatch)
    vocab, padded = 80, 128
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g, requires_grad=True)
    weight = torch.randn(padded, 32, generator=g)
    weight[vocab:] = 0  # as the model keeps its padding rows
    weight.requires_grad_()
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    targets = torch.randint(vocab, (64,), generator=g)
    targets[::8] = -100  # ignored by the full loss (F.cross_entropy's default ignore_index): by the kernels too
    x_ref, w_ref = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        loss = chunked_loss.chunked_cross_entropy(x, weight, targets, vocab, bias, impl=impl)
        reference = chunked_loss.full_cross_entropy(x_ref, w_ref, targets, vocab, bias)
    loss.backward()
    reference.backward()
    assert loss.item() == reference.item()
    assert torch.equal(x.grad, x_ref.grad) and torch.equal(weight.grad, w_ref.grad)
    assert weight.grad[vocab:].abs().max() == 0
    assert seen == (dict(accum_dtype=torch.float32) if impl == "liger" else dict(filter_eps=None, impl="cce"))


@pytest.mark.parametrize("impl", ["liger", "cce"])
def test_triton_chunked_losses_run_outside_torch_compile(impl, monkeypatch):
    """fast_6 compiles its model, loss included, and Dynamo must not trace into the libraries' own autograd
    functions: on torch 2.11 it could not trace liger's (fake tensors fail on its torch.addmm(out_dtype=...,
    out=...): fast_6 died before its first step on an H100, tests/test_gpu.py::test_fast_stages_run_on_cuda).
    The stand-in records whether it ran under Dynamo's tracing; it must have run, and eagerly."""
    stand_ins(monkeypatch)
    module, name = {
        "liger": ("liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy"),
        "cce": ("cut_cross_entropy", "linear_cross_entropy"),
    }[impl]
    kernel, traced = getattr(sys.modules[module], name), []

    def recording_kernel(*args, **kwargs):
        traced.append(torch.compiler.is_compiling())
        return kernel(*args, **kwargs)

    monkeypatch.setattr(sys.modules[module], name, recording_kernel)
    vocab, padded = 80, 128
    x, weight = torch.randn(64, 32, requires_grad=True), torch.randn(padded, 32, requires_grad=True)
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    torch._dynamo.reset()
    loss_fn = torch.compile(lambda *a: chunked_loss.chunked_cross_entropy(*a, impl=impl), backend="eager")
    loss_fn(x, weight, torch.randint(vocab, (64,)), vocab, bias).backward()
    assert traced == [False] and x.grad is not None


@pytest.mark.slow
def test_liger_kernels_match_the_full_loss_under_tritons_interpreter(char_data):
    """liger-kernel's real Triton kernels, run on the CPU by Triton's interpreter: two training steps of a
    padded-vocabulary model with loss_impl="liger" give the full loss's losses and gradients (CHUNK_RTOL and
    CHUNK_ATOL). TRITON_INTERPRET must be set before Triton is imported, hence a subprocess. Needs liger-kernel
    and triton (`pip install liger-kernel`), skipped without them: the default suite's environment has neither,
    and Cut Cross-Entropy's kernels use a function the interpreter lacks (it is checked on CUDA, test_gpu.py)."""
    if importlib.util.find_spec("liger_kernel") is None or importlib.util.find_spec("triton") is None:
        pytest.skip("liger-kernel and triton are not installed (pip install liger-kernel)")
    script = f"""
import torch
from test_beyond_equivalence import CHUNK_ATOL, CHUNK_RTOL
from test_ladder_equivalence import tiny_config, train_with_grads
full, grads_full = train_with_grads(tiny_config({str(char_data)!r}, vocab_multiple=64), 2)
liger, grads_liger = train_with_grads(tiny_config({str(char_data)!r}, vocab_multiple=64, loss="chunked",
                                                  loss_impl="liger"), 2)
assert liger.raw.config.loss_impl == "liger"
assert liger.losses == __import__("pytest").approx(full.losses, rel=CHUNK_RTOL), (liger.losses, full.losses)
for gl, gf in zip(grads_liger, grads_full):
    torch.testing.assert_close(gl, gf, rtol=CHUNK_RTOL, atol=CHUNK_ATOL)
print("liger matches", liger.losses, full.losses)
"""
    r = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    print(r.stdout)


# ---- FSDP mixed precision (lean_1) and with the chunked loss (lean_2), on 2 gloo processes ---------------------

# The reduction: FSDP's MixedPrecisionPolicy computes each rank's micro-batches with bf16 parameters and promises to
# reduce their gradients in fp32, so the ranks' sum loses nothing to bf16. fsdp_bf16_first_gradients computes that
# promise on one process: the same bf16 operations (tolerance 0 for them), then the fp32 average and sum in another
# order and the clip's norm summed in another order: fp32 reassociation, a few roundings of 2^-24 each (measured
# 1.1e-7 norm-wise). A reduction in bf16 (the policy without reduce_dtype reduces in param_dtype) rounds each reduced
# gradient once more: adding two bf16 values of one exponent takes a 9th bit, dropped on about half the entries, half
# a bf16 ulp (2^-8 relative) each: ~2^-9 norm-wise (measured 1.5e-3). The bound, 2^-12, is ~2^11 times the
# reassociation and 1/8 of one bf16 rounding. The update check below cannot see it (4.81% either way).
FSDP_BF16_REDUCE_REL = 2**-12

# The update: bf16 compute rounds every op's output (FSDP runs the whole unit in bf16: layer norms and residual adds
# too) by up to u = 2^-8, so step 1's gradients differ from fp32's (measured 0.37% norm-wise, up to 1.0% for one
# tensor). Adam divides each gradient by its own size: an entry whose true gradient is smaller than its rounding error
# (the attention's key bias, whose true gradient is 0, and other near-zero entries) moves by lr the other way, a
# difference of 2 lr where a well-sized entry's is ~1% of lr. With a fraction f of entries flipping, the update
# differs by ~2 sqrt(f): measured f = 0.32% at step 1, so 11% (Adam's eps softens it: 9.0% measured); later steps'
# moments average the flips out (4.8% after 3 steps). f is set by how many gradients lie near 0, not by u, so no
# bound follows from u alone: 15% is step 1's estimate with margin, a check that bf16 training tracks fp32 (a
# learning rate 20% lower gives 20%, asserted as a control), not of the reduction (FSDP_BF16_REDUCE_REL is).
# Losses: within 2e-3, as under autocast; the chunked loss is returned in bf16 (see above), which adds up to half a
# bf16 unit (2^-8 relative) per micro-batch.
FSDP_BF16_UPDATE_REL, FSDP_BF16_LOSS_ATOL = 0.15, 2e-3


def fsdp_bf16_first_gradients(cfg, char_data) -> dict:
    """Step 1's gradients under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) as its contract says,
    on one process: each rank's micro-batches through a bf16 copy of the model (FSDP gathers bf16 parameters and
    casts the inputs), each gradient cast to fp32, averaged over the ranks and summed over the micro-batches in fp32,
    then clipped as train_step clips (activation checkpointing recomputes the same numbers: left out). On one
    thread, as the ranks run (launch_workers): a matmul blocked for more threads sums in another order, and its bf16
    output then differs by an ulp here and there (measured 7e-5 norm-wise with 2 threads)."""
    x, y = loader_batches(tiny_config(char_data, batch_size=cfg.nproc * cfg.batch_size), 1)[0]  # ranks' in order
    raw = train_with_grads(tiny_config(char_data, loss=cfg.loss, goal=cfg.goal), 0)[0].raw.to(torch.bfloat16)
    params = {param_name(n): p for n, p in raw.named_parameters()}
    total = {k: torch.zeros_like(p, dtype=torch.float32) for k, p in params.items()}
    k, threads = cfg.grad_accum_steps, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for xr, yr in zip(x.chunk(cfg.nproc), y.chunk(cfg.nproc)):
            for xm, ym in zip(xr.chunk(k), yr.chunk(k)):
                grads = torch.autograd.grad(raw(xm, ym)[1] / k, list(params.values()))
                for name, g in zip(params, grads):
                    total[name] += g.float() / cfg.nproc
    finally:
        torch.set_num_threads(threads)
    clip = min(1.0, cfg.grad_clip / (global_norm(total) + 1e-6))
    return {name: g * clip for name, g in total.items()}


def update_error(params: dict, reference: dict, initial: dict) -> float:
    """||(params - initial) - (reference - initial)|| / ||reference - initial||, over all parameters."""
    diff = torch.cat([(params[k] - reference[k]).flatten() for k in reference])
    moved = torch.cat([(reference[k] - initial[k]).flatten() for k in reference])
    return (diff.norm() / moved.norm()).item()


@pytest.mark.parametrize(
    "stage_settings",
    [
        dict(fsdp_mixed_precision=True),  # lean_1
        pytest.param(dict(fsdp_mixed_precision=True, loss="chunked"), marks=needs_torch_chunked_loss),  # lean_2
    ],
)
def test_fsdp_bf16_parameters_track_fp32_on_one_process(stage_settings, char_data, tmp_path):
    memory_4 = dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False)
    # goal "memory", as the lean ladder runs (gpt/ladder.py:Ladder.goal): the chunked loss is kept whatever its time
    cfg = tiny_config(
        char_data, distributed="fsdp", nproc=NPROC, batch_size=RANK_BATCH, goal="memory", **memory_4, **stage_settings
    )
    launch_workers(cfg, DIST_STEPS, tmp_path, "--cpu-bf16")  # bf16 even where this CPU would keep fp32
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(NPROC)]
    assert all(r["model_loss"] == cfg.loss for r in ranks)  # the built model computes the loss under test
    single = train_with_grads(tiny_config(char_data, batch_size=NPROC * RANK_BATCH), DIST_STEPS)[0]
    initial = full_params(train_with_grads(tiny_config(char_data), 0)[0].raw)  # the same seed's weights
    params = ranks[0]["params"]
    assert all(p.dtype == torch.float32 for p in params.values())  # fp32 master weights
    emulated, first = fsdp_bf16_first_gradients(cfg, char_data), ranks[0]["grads"][0]
    reduce_error = global_norm({n: first[n] - emulated[n] for n in emulated}) / global_norm(emulated)
    print(f"\nstep 1 gradients vs bf16 compute with an fp32 reduction: {reduce_error:.3g} norm-wise")
    assert reduce_error < FSDP_BF16_REDUCE_REL
    rank_mean = [sum(losses) / NPROC for losses in zip(*(r["losses"] for r in ranks))]
    print(f"\nFSDP bf16 {stage_settings} vs fp32 losses: {rank_mean} vs {single.losses}")
    bf16_loss = 2**-8 * max(single.losses) if cfg.loss == "chunked" else 0.0
    assert max(abs(a - b) for a, b in zip(rank_mean, single.losses)) < FSDP_BF16_LOSS_ATOL + bf16_loss
    error = update_error(params, full_params(single.raw), initial)
    slower = train_with_grads(tiny_config(char_data, batch_size=NPROC * RANK_BATCH, lr=0.8 * cfg.lr), DIST_STEPS)[0]
    control = update_error(full_params(slower.raw), full_params(single.raw), initial)
    print(
        f"update after {DIST_STEPS} steps vs fp32 on one process: {error:.3g} relative "
        f"(fp32 at 0.8 x lr: {control:.3g})"
    )
    assert error < FSDP_BF16_UPDATE_REL < control


# ---- CPU offload (lean_3) ----------------------------------------------------------------------------------


def test_cpu_offload_is_skipped_without_a_gpu(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(STAGES_DIR / "lean_3_cpu_offload.py"),
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--wandb",
            "disabled",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == EXIT_SKIPPED, r.stderr
    record = json.loads((tmp_path / "lean_3_cpu_offload.json").read_text())
    assert record["status"] == "skipped" and record["reason"].startswith("nothing to offload to")
    assert record["config"]["fsdp_cpu_offload"] and record["config"]["fsdp_mixed_precision"]


# lean_3 over memory_4, mixed precision aside (lean_1's check; an AMX CPU would compute in bf16): CPU offload runs
# torch's other code paths, sharded parameters and gradients kept as host tensors, each unit's shard copied to the
# compute device before its all-gather and its gradient copied back, AdamW stepping the host shards. On a CPU the
# copies are host to host (unpinned: fsdp_policies), and the sums the same as memory_4's, in the same order: its
# float32 bounds hold. What a CPU cannot check, the copies to and from a GPU: tests/test_gpu.py.
LEAN_3 = dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False, fsdp_cpu_offload=True)


def test_cpu_offload_on_two_processes_matches_one_process(char_data, tmp_path):
    check_two_processes_match_one(
        "fsdp", LEAN_3, char_data, tmp_path, "cpu", (DIST_GRAD_RTOL, DIST_GRAD_ATOL), (DIST_PARAM_RTOL, DIST_PARAM_ATOL)
    )


def test_every_fsdp_unit_gets_the_offload_and_precision_policies(monkeypatch, char_data):
    """A unit sharded without them trains the same (the comparison above cannot see it) but keeps its parameters,
    gradients and AdamW state on the GPU, or computes in fp32: every block and the root must get them."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_flops", lambda dtype: 2.0 if dtype == torch.bfloat16 else 1.0)
    cfg = tiny_config(char_data, distributed="fsdp", nproc=NPROC, fsdp_mixed_precision=True, fsdp_cpu_offload=True)
    with fake_process_group():
        groups = [unit._get_fsdp_state()._fsdp_param_group for unit in fsdp_units(build_model(cfg, 65, CPU)[0])]
    assert len(groups) == cfg.n_layer + 1
    assert all(isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups)
    assert all(p.offload_to_cpu and not p.pin_memory for g in groups for p in g.fsdp_params)
    assert all(g.mp_policy == fsdp_policies(cfg, CPU)["mp_policy"] for g in groups)


def test_fsdp_policies_follow_the_config(monkeypatch, char_data):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    rates = {torch.float32: 300e9, torch.bfloat16: 2400e9}  # a CPU with AMX
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_flops", lambda dtype: rates[dtype])
    assert fsdp_policies(tiny_config(char_data, distributed="fsdp"), CPU) == {}
    lean_3 = tiny_config(char_data, distributed="fsdp", fsdp_mixed_precision=True, fsdp_cpu_offload=True)
    policies = fsdp_policies(lean_3, CPU)
    assert policies["mp_policy"] == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert isinstance(policies["offload_policy"], CPUOffloadPolicy) and not policies["offload_policy"].pin_memory
    assert fsdp_policies(lean_3, torch.device("cuda"))["offload_policy"].pin_memory  # fast copies to the GPU
    assert owner("fsdp_mixed_precision").no_effect(lean_3, CPU) is None

    rates[torch.bfloat16] = 1.3e9  # a CPU with AVX2 only: bf16 ~100x slower than fp32, so fp32 is kept
    assert "mp_policy" not in fsdp_policies(lean_3, CPU)
    assert owner("fsdp_mixed_precision").no_effect(lean_3, CPU).startswith("kept fp32 parameters for compute")


# ---- on a GPU ------------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
def test_bf16_stage_on_cuda_drops_the_scaler_and_turns_tf32_on(char_data):
    device = torch.device("cuda")
    cfg = tiny_config(char_data, amp=True, amp_bf16=True, tf32=True, device="cuda")
    amp = mixed_precision(cfg, device)
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        assert amp.dtype == torch.float16 and amp.scaler is not None and "no bf16" in amp.why
        return
    assert amp.dtype == torch.bfloat16 and amp.scaler is None
    expected = "tf32" if torch.cuda.get_device_capability()[0] >= 8 else "fp32"
    assert matmul_precision(cfg, device) == expected
    assert torch.backends.cuda.matmul.allow_tf32 == (cfg.tf32)
    matmul_precision(tiny_config(char_data, device="cuda"), device)  # and back off
    assert not torch.backends.cuda.matmul.allow_tf32


def test_loss_benchmark_times_the_full_loss_and_each_available_implementation(capsys):
    from gpt import bench_loss

    assert (
        bench_loss.main(
            [
                "--rows",
                "64",
                "--dim",
                "16",
                "--vocab",
                "80",
                "--repeats",
                "2",
                "--warmup",
                "0",
                "--device",
                "cpu",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "64 rows x 16 -> 80 classes (padded to 128)" in out and "\nfull " in out
    assert ("chunked (torch)" in out) == chunked_loss.installed("torch")
    assert "liger, cce\n" in out.split("not available here: ")[1]  # Triton kernels: CUDA only


def test_a_run_for_time_keeps_the_explicit_attention_where_sdpa_was_measured_slower(char_data, monkeypatch):
    """fast_3's CPU rule: SDPA only where one forward and backward of it was measured faster at the stage's shape
    and precision; otherwise the explicit attention, and the record's no_effect gives both times. The measurement
    is kept (gpt/machine_cache.py) and leaves the random state alone. A GPU follows the same rule, measured there."""
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


def built_model_config(cfg):
    """The GPTConfig of the model a stage with `cfg` builds on the CPU (vocabulary 65)."""
    from gpt.train import build_model

    return build_model(cfg, 65, CPU)[0].config


def test_the_attention_benchmark_leaves_the_random_state_alone():
    """A stage measures the attentions while building its model, right after seeding it: the weights must be the
    seed's, whatever the benchmark drew (it uses the random generator and dropout)."""
    from gpt.optimizations.fused_attention import time_attentions

    torch.manual_seed(0)
    state = torch.get_rng_state()
    times = time_attentions(2, 2, 8, 4, torch.float32, 0.1, compiled=False)
    assert torch.equal(torch.get_rng_state(), state) and all(t > 0 for t in times)


def test_a_cpu_run_for_time_keeps_the_full_loss_where_the_chunked_one_was_measured_slower(char_data, monkeypatch):
    """fast_6's CPU rule, as fast_3's: the chunked loss only where its head and loss were measured faster than the
    full loss's at the stage's shape (at 65 characters its chunks only add work); a run for memory (the lean
    ladder) keeps it whatever the time, since its point there is the logits it never holds."""
    from gpt.optimizations import chunked_loss

    times = iter([{"median_ms": 2.0}, {"median_ms": 5.0}])
    monkeypatch.setattr(chunked_loss, "time_head_and_loss", lambda *a, **k: next(times))
    monkeypatch.setattr(chunked_loss, "resolve", lambda choice, device_type: "torch")
    cfg = tiny_config(char_data, loss="chunked", block_size=12, samples=320)  # a shape of its own
    loss, why = chunked_loss.loss_used(cfg, "cpu", 65)
    assert loss == "full" and why.startswith("kept the full loss: the chunked loss (torch) is slower on this CPU")
    assert "96 rows x 32 -> 65 classes, float32: full 2.00 ms, chunked 5.00 ms" in why  # batch 8 x block 12
    assert owner("loss").no_effect(cfg, CPU) == why  # measured once, then read from the cache
    assert chunked_loss.loss_used(
        tiny_config(char_data, loss="chunked", block_size=12, samples=320, goal="memory"), "cpu", 65
    ) == ("chunked", None)
    assert built_model_config(cfg).loss == "full"
    # a GPU measures too, under its own name: there the chunked loss was measured faster
    times = iter([{"median_ms": 5.0}, {"median_ms": 2.0}])
    monkeypatch.setattr(chunked_loss, "device_label", lambda device: "GPU (H200)")
    assert chunked_loss.loss_used(cfg, "cuda", 65) == ("chunked", None)
    times = iter([{"median_ms": 2.0}, {"median_ms": 5.0}])
    other = tiny_config(char_data, loss="chunked", block_size=12, samples=320, batch_size=4)
    assert "slower on this GPU (H200) at this shape" in chunked_loss.loss_used(other, "cuda", 65)[1]


def test_a_run_for_memory_keeps_sdpa_whatever_its_time(char_data, monkeypatch):
    from gpt.optimizations import fused_attention

    monkeypatch.setattr(fused_attention, "time_attentions", lambda *shape: [1.0, 4.0])
    cfg = tiny_config(char_data, attention="sdpa", block_size=28, batch_size=4, samples=40, goal="memory")
    assert fused_attention.attention_used(cfg, "cpu") == ("sdpa", None)


def test_an_older_linear_cross_entropy_falls_back_instead_of_failing_the_stage(monkeypatch):
    """F.linear_cross_entropy came into torch's history before its linear_bias= and options= (the call
    chunked_cross_entropy makes): a torch with the older function counts as one without it, so the stages fall back
    to liger / Cut Cross-Entropy on CUDA or are skipped with the reason, instead of dying in a TypeError."""

    def older(input, linear_weight, target, bias=None, reduction="mean"): ...  # a stand-in of the older signature

    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", older, raising=False)  # 2.11 has none
    assert not chunked_loss.installed("torch")
    reason = why_cannot_run(stage_config("lean_2_chunked_loss", "smoke", device="cpu"), "cpu")
    assert reason.startswith("the chunked loss on a cpu needs PyTorch 2.12") and "lacks linear_bias=" in reason
    fake_module(monkeypatch, "liger_kernel")
    assert chunked_loss.resolve("auto", "cuda") == "liger"


@pytest.mark.parametrize("gpu, bf16_units", [("V100 or T4: emulated bf16 only", False), ("A100 or newer", True)])
def test_every_bf16_choice_on_a_gpu_follows_one_rule(gpu, bf16_units, char_data, monkeypatch):
    """autocast (amp_bf16), FSDP's mixed precision (lean_1) and Muon's Newton-Schulz compute in bf16 on a GPU only
    where it has bf16 units: torch.cuda.is_bf16_supported() also counts emulated bf16, several times slower than
    fp16 on a T4 or V100: such a GPU keeps fp16 with its GradScaler, FSDP's fp32 parameters and fp32 Newton-Schulz.
    FSDP once asked only `device.type != "cpu"` and gathered bf16 there."""
    from gpt.optimizations.muon import newton_schulz_dtype

    def is_bf16_supported(including_emulation=True):
        return bf16_units or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    cuda, bf16 = torch.device("cuda"), torch.bfloat16
    lean_1 = tiny_config(char_data, distributed="fsdp", fsdp_mixed_precision=True, device="cuda")
    amp = mixed_precision(tiny_config(char_data, amp=True, amp_bf16=True, device="cuda"), cuda)
    fsdp = fsdp_policies(lean_1, cuda).get("mp_policy")
    chosen = {
        "autocast": amp.dtype == bf16,
        "FSDP": fsdp is not None and fsdp.param_dtype == bf16,
        "Newton-Schulz": newton_schulz_dtype("cuda") == bf16,
    }
    assert chosen == dict.fromkeys(chosen, bf16_units), gpu
    assert bf16_units or (amp.dtype == torch.float16 and "this GPU has no bf16 units" in amp.why)
    no_effect = owner("fsdp_mixed_precision").no_effect(lean_1, cuda)
    assert (no_effect is None) == bf16_units and (bf16_units or "no bf16 units" in no_effect)


@needs_torch_chunked_loss
@pytest.mark.slow
def test_bf16_chunked_weight_gradient_at_the_stages_shape():
    """The head's weight gradient of the bf16 chunked loss against fp32, at fast_6_chunked_loss's reference shape
    (32768 rows x 192, vocabulary 65 padded to 128: 128 chunks of LOSS_CHUNK_ROWS), on random inputs: within
    BF16_CHUNKED_WEIGHT_GRAD more than the bf16 full loss's (measured 2.6e-2 and 3.4e-3 on this project's CPU)."""
    cfg, vocab = stage_config("fast_6_chunked_loss", "reference"), 65
    rows, dim = cfg.micro_batch_size * cfg.block_size, cfg.model_shape["n_embd"]
    padded = -(-vocab // cfg.vocab_multiple) * cfg.vocab_multiple
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(rows, dim, generator=g), 0.02 * torch.randn(padded, dim, generator=g)
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    targets = torch.randint(vocab, (rows,), generator=g)

    def weight_grad(loss_fn, dtype):
        w = weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss_fn(x.clone().requires_grad_(), w, targets, vocab, bias).backward()
        return {"weight": w.grad[:vocab]}

    fp32 = weight_grad(chunked_loss.full_cross_entropy, torch.float32)
    full_rel = max_diff(weight_grad(chunked_loss.full_cross_entropy, torch.bfloat16), fp32)[1]
    chunked = weight_grad(lambda *a: chunked_loss.chunked_cross_entropy(*a, impl="torch"), torch.bfloat16)
    chunked_rel = max_diff(chunked, fp32)[1]
    print(
        f"\nbf16 vs fp32 weight gradient at {rows} x {dim} -> {padded}: full {full_rel:.3g}, chunked {chunked_rel:.3g}"
    )
    assert chunked_rel < 2 * full_rel + BF16_CHUNKED_WEIGHT_GRAD

"""Precision (gpt/optimizations/precision.py): bf16 autocast, fp16 with a GradScaler, bf16 without one, and TF32.

bf16 autocast (speed_5 on a CPU) and fp16 with a GradScaler (speed_5 on CUDA, forced on the CPU) track fp32, and the
scaler skips a step with inf gradients; bf16 without a scaler and TF32 (fast_2) change nothing on a CPU and, forced,
track fp32; and the one rule for computing in bf16, which FSDP's mixed precision and Muon's Newton-Schulz follow too. On
the CPU, through the project's own code (tests/equivalence.py); on CUDA in tests/test_gpu.py."""

import dataclasses
import math

import pytest
import torch
from dist_worker import full_params, run_steps
from equivalence import CPU, NO_CLIP, loader_batches, max_diff, report, tiny_config, train_with_grads

from gpt.data import make_dataset
from gpt.ladder import stage_config
from gpt.optimizations import owner
from gpt.optimizations.parallel import fsdp_policies
from gpt.optimizations.precision import MixedPrecision, matmul_precision, mixed_precision
from gpt.stage import no_effect
from gpt.train import build_model, train_step

# ---- mixed precision (speed_5) ---------------------------------------------------------------------------

# bf16 keeps 8 significant bits: every matmul output is rounded by up to 2^-8 ~ 0.4% relative (half its spacing). The
# loss itself is fp32 (gpt/model.py upcasts the logits), so it moves by the logits' rounding errors,
# which mostly cancel in the mean over the 8 x 16 positions: measured ~1.3e-4 over 8 steps. The bound,
# 2e-3, leaves 15x; it is small next to what 8 steps at lr 3e-3 change the loss by (asserted), and a
# loss computed in bf16 itself (spacing 2^-6 ~ 0.016 near 4) would typically break it.
AMP_LOSS_ATOL = 2e-3


def test_bf16_autocast_loss_tracks_fp32(char_data):
    cfg = dict(lr=3e-3)
    # The CPU's autocast where bf16 is the faster dtype; whether it is, is measured per CPU (speed_5's rule,
    # tested below: test_cpu_keeps_fp32_where_bf16_is_slower), so the maths is checked in bf16 on every CPU.
    amp = MixedPrecision(torch.bfloat16, "cpu")
    fp32 = run_steps(tiny_config(char_data, **cfg), steps=8)
    bf16 = run_steps(tiny_config(char_data, amp=True, **cfg), steps=8, amp=amp)
    with torch.no_grad(), amp.autocast():  # the matmuls really ran in bf16
        assert bf16.model(bf16.inputs[0])[0].dtype == torch.bfloat16
    diffs = [abs(a - b) for a, b in zip(bf16.losses, fp32.losses)]
    print(
        f"\nbf16 vs fp32 losses: {[round(x, 4) for x in bf16.losses]} vs {[round(x, 4) for x in fp32.losses]}; "
        f"max |diff| {max(diffs):.3g}"
    )
    assert max(diffs) < AMP_LOSS_ATOL
    assert fp32.losses[0] - fp32.losses[-1] > 5 * AMP_LOSS_ATOL  # the tolerance is small next to learning


# ---- fp16 + GradScaler (speed_5 on CUDA), forced on the CPU ----------------------------------------------

# On CUDA, speed_5 runs fp16 autocast with a GradScaler; the CPU picks bf16 (gpt/optimizations/precision.py:
# mixed_precision), so these tests build the CUDA choice themselves and run it through train_step on the
# CPU, whose build has fp16 autocast and GradScaler("cpu"). fp16 keeps 11 significant bits (bf16: 8), so each
# matmul output is rounded by up to 2^-11 ~ 5e-4 relative. First-step gradients (same weights, clipping off
# so that a wrong scale could not be hidden by it): measured max |diff| 6.1e-4 of each tensor's largest
# value; the bound, 2e-3, is broken by bf16 (measured 4.6e-3) and by gradients left scaled (x65536). Losses
# over 8 steps with accumulation x2: measured 8.4e-5; bound 5e-4. (AdamW divides by the gradients' own size,
# so the losses alone would not see a wrong scale: the gradients are the check of the scaler.)
FP16_GRAD_RTOL = 2e-3


FP16_LOSS_ATOL = 5e-4


def fp16_with_scaler(**scaler_args) -> MixedPrecision:
    """fp16 autocast with its GradScaler, enabled as for fp16 on CUDA; `scaler_args`: a scaler of other settings."""
    amp = MixedPrecision(torch.float16, "cpu")
    if scaler_args:
        amp.scaler = torch.amp.GradScaler("cpu", **scaler_args)
    return amp


def test_fp16_with_grad_scaler_and_accumulation_tracks_fp32(char_data):
    check_fp16_tracks_fp32(char_data, fp16_with_scaler())


def check_fp16_tracks_fp32(char_data, amp: MixedPrecision, device: str = "cpu") -> None:
    """Also run on a GPU by tests/test_gpu.py, with the amp mixed_precision chooses there."""
    cfg = dict(lr=3e-3, batch_size=16, grad_accum_steps=2, grad_clip=NO_CLIP, device=device)
    fp32, grads_fp32 = train_with_grads(tiny_config(char_data, **cfg), 8)
    fp16, grads_fp16 = train_with_grads(tiny_config(char_data, **cfg), 8, amp=amp)
    with torch.no_grad(), amp.autocast():  # the matmuls really ran in fp16
        assert fp16.model(fp16.inputs[0])[0].dtype == torch.float16
    assert amp.scaler.get_scale() == 2.0**16  # the default scale never overflowed: every step was applied
    report("fp16 + scaler vs fp32, step 1 gradients", grads_fp16[0], grads_fp32[0])
    assert max_diff(grads_fp16[0], grads_fp32[0])[1] < FP16_GRAD_RTOL
    diffs = [abs(a - b) for a, b in zip(fp16.losses, fp32.losses)]
    print(f"fp16 + scaler vs fp32 losses over 8 steps: max |diff| {max(diffs):.3g}")
    assert all(math.isfinite(loss) for loss in fp16.losses) and max(diffs) < FP16_LOSS_ATOL
    assert fp32.losses[0] - fp32.losses[-1] > 100 * FP16_LOSS_ATOL  # the tolerance is small next to learning


def test_grad_scaler_skips_a_step_with_inf_gradients_and_halves_its_scale(char_data):
    """The GradScaler skips a step with inf gradients and halves its scale, as documented.

    GradScaler's documented rule: after `growth_interval` steps without inf/NaN gradients the scale is multiplied by
    growth_factor (2); a step whose gradients hold an inf is skipped (parameters and AdamW's state untouched) and the
    scale multiplied by backoff_factor (0.5)."""
    cfg = tiny_config(char_data, lr=3e-3, batch_size=16, grad_accum_steps=2)
    batches = loader_batches(cfg, steps=4)
    raw, model, optimizer = build_model(cfg, make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size).vocab_size, CPU)
    amp = fp16_with_scaler(init_scale=2.0**10, growth_interval=2)
    poisoned = raw.transformer.h[0].mlp.c_fc.weight
    scales, applied = [], []
    for step, (x, y) in enumerate(batches):
        before = {
            **full_params(raw),
            **{f"exp_avg {i}": s["exp_avg"].clone() for i, s in enumerate(optimizer.state.values())},
        }
        hook = poisoned.register_hook(lambda g: torch.full_like(g, float("inf"))) if step == 2 else None
        loss = train_step(model, optimizer, x, y, cfg, amp)
        if hook:
            hook.remove()
        after = {**full_params(raw), **{f"exp_avg {i}": s["exp_avg"] for i, s in enumerate(optimizer.state.values())}}
        assert math.isfinite(loss.item())  # the loss is fine: only the injected gradient is not
        scales.append(amp.scaler.get_scale())
        applied.append(any(not torch.equal(after[k], v) for k, v in before.items()))
    assert applied == [True, True, False, True]
    assert scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10]  # grown after 2 good steps, halved by the inf one


# ---- bf16 without a scaler, TF32 (fast_2): no effect on a CPU -----------------------------------------------


def test_bf16_stage_changes_nothing_on_a_cpu(char_data, monkeypatch):
    """The bf16 stage changes nothing on a CPU, and its record says why.

    On the CPU autocast is bf16 (or fp32) without a scaler whether amp_bf16 is on or not, and TF32 does not exist: the
    stage runs the same code, and its record says why (and the next stage's, with SDPA measured faster, says
    nothing)."""
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
    """fast_2's bf16 without a scaler trains like fp32.

    fast_2's choice on a GPU with bf16 units computes in bf16 (not fp16: fp16 without a scaler underflows small
    gradients at scale; on this tiny model it is closer to fp32 than bf16 is, so the dtype is the check) and scales
    nothing (a GradScaler left on gives the same bits, its power-of-2 scale is exact in bf16, but keeps its host sync:
    the choice is the check); run on the CPU, its first step's gradients match fp32's within BF16_GRAD_RTOL and its
    losses within speed_5's AMP_LOSS_ATOL."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # an A100's answer
    chosen = mixed_precision(tiny_config(char_data, amp=True, amp_bf16=True, device="cuda"), torch.device("cuda"))
    assert chosen.dtype == torch.bfloat16 and not chosen.scaler.is_enabled(), chosen
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
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_rates_in_turns", lambda dtypes, n: (n, rates))
    amp = mixed_precision(tiny_config(char_data, amp=True), CPU)
    assert amp.dtype == torch.float32 and not amp.scaler.is_enabled() and "bf16 150.0, fp32 300.0 GFLOP/s" in amp.why
    assert owner("amp").no_effect(tiny_config(char_data, amp=True), CPU) == amp.why
    rates[torch.bfloat16] = 2400e9  # a CPU with AMX
    assert mixed_precision(tiny_config(char_data, amp=True), CPU).dtype == torch.bfloat16
    assert owner("amp").no_effect(tiny_config(char_data, amp=True), CPU) is None


def test_the_cpu_rule_times_bf16_and_fp32_in_turns_so_a_passing_slowdown_slows_both(monkeypatch, tmp_path):
    """The CPU's bf16 rule times the two dtypes' matmuls in turns: a slowdown of the host that passes slows both alike.

    A host here whose bf16 matmuls run at twice fp32's rate, every call 4x slower over its first 0.1 s (a neighbour,
    a clock ramping up), on the test's own clock. Timed one dtype after the other, bf16 took all of the slowdown and
    lost, as it did once in a first run of c9ed59d; in turns both calls of each round share it. Seen failing on the
    version before, which timed bf16 for 0.05 s and then fp32 (it chose fp32)."""
    import types

    from gpt import clocks, flops
    from gpt.optimizations.precision import cpu_bf16_is_faster

    host = {"now": 0.0}
    flop_s = {torch.bfloat16: 400e9, torch.float32: 200e9}

    def matmul(a, b):
        slowdown = 4.0 if host["now"] < 0.1 else 1.0
        host["now"] += slowdown * 2 * a.shape[0] * a.shape[1] * b.shape[1] / flop_s[a.dtype]

    fake_time = types.SimpleNamespace(
        perf_counter=lambda: host["now"], sleep=lambda s: host.update(now=host["now"] + s)
    )
    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    monkeypatch.setattr(flops, "time", fake_time)
    monkeypatch.setattr(clocks, "time", fake_time)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # measured here, not read from another test's cache
    faster, why = cpu_bf16_is_faster()
    assert faster, why
    assert "bf16 400.0, fp32 200.0 GFLOP/s (1024 x 1024, in turns)" in why  # the medians: rounds after the slowdown


@pytest.mark.parametrize("gpu, bf16_units", [("V100 or T4: emulated bf16 only", False), ("A100 or newer", True)])
def test_every_bf16_choice_on_a_gpu_follows_one_rule(gpu, bf16_units, char_data, monkeypatch):
    """Every bf16 choice on a GPU follows one rule: bf16 only where the GPU has bf16 units.

    autocast (amp_bf16), FSDP's mixed precision (lean_1) and Muon's Newton-Schulz compute in bf16 on a GPU only where it
    has bf16 units: torch.cuda.is_bf16_supported() also counts emulated bf16, several times slower than fp16 on a T4 or
    V100: such a GPU keeps fp16 with its GradScaler, FSDP's fp32 parameters and fp32 Newton-Schulz. FSDP once asked only
    `device.type != "cpu"` and gathered bf16 there."""
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


# ---- on a GPU ------------------------------------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@cuda
def test_bf16_stage_on_cuda_drops_the_scaler_and_turns_tf32_on(char_data):
    device = torch.device("cuda")
    cfg = tiny_config(char_data, amp=True, amp_bf16=True, tf32=True, device="cuda")
    amp = mixed_precision(cfg, device)
    if not torch.cuda.is_bf16_supported(including_emulation=False):
        assert amp.dtype == torch.float16 and amp.scaler.is_enabled() and "no bf16" in amp.why
        return
    assert amp.dtype == torch.bfloat16 and not amp.scaler.is_enabled()
    expected = "tf32" if torch.cuda.get_device_capability()[0] >= 8 else "fp32"
    assert matmul_precision(cfg, device) == expected
    assert torch.backends.cuda.matmul.allow_tf32 == (cfg.tf32)
    matmul_precision(tiny_config(char_data, device="cuda"), device)  # and back off
    assert not torch.backends.cuda.matmul.allow_tf32

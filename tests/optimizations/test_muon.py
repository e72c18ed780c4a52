"""Muon (gpt/optimizations/muon.py, the speedrun ladder) gets exactly the blocks' matrices and AdamW everything else.

One step of the combined optimizer is the two torch optimizers' steps, one line for bad settings (the schedule's too),
and a Muon run that learns; the Newton-Schulz iteration and a Muon step in bf16 against float32 (on the CPU here, on
CUDA in tests/test_gpu.py)."""

import copy
import math
import re
import subprocess
import sys

import pytest
import torch
from conftest import HAS_MUON, REPO, needs_muon
from test_time_to_loss import smoke_to_a_loss

from gpt import optimizations, time_to_loss, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.muon import BatchedMuon, MuonWithAdamW, newton_schulz_fp32, newton_schulz_in
from gpt.optimizations.schedule import learning_rate, set_learning_rates

# The blocks' matrices, named independently of the code under test.
HIDDEN = re.compile(r"transformer\.h\.\d+\.(attn\.c_attn|attn\.c_proj|mlp\.c_fc|mlp\.c_proj)\.weight")


def built(char_data, device: str = "cpu", **overrides):
    """The optimizer build_model makes with Muon on `device` (TrainConfig's gpt-mini unless overridden).

    Returns (cfg, the GPT, the optimizer). The weights are drawn on the CPU from the config's seed, so every device
    starts alike."""
    cfg = optimizations.validate(
        TrainConfig(data_dir=str(char_data), device=device, matrix_optimizer="muon", **overrides)
    )
    raw, model, optimizer = train.build_model(cfg, 65, torch.device(device))
    return cfg, raw, optimizer


def ids(groups) -> list[int]:
    return [id(p) for g in groups for p in g["params"]]


# ---- who updates what --------------------------------------------------------------------------------------


@needs_muon
@pytest.mark.parametrize("n_layer", [None, 2])  # gpt-mini's 6 blocks, and 2
def test_muon_gets_every_block_matrix_once_and_adamw_every_other_parameter_once(char_data, n_layer):
    cfg, raw, optimizer = built(char_data, n_layer=n_layer)
    assert isinstance(optimizer, MuonWithAdamW)
    named = dict(raw.named_parameters())  # the tied lm_head is the token embedding: listed once
    hidden = {id(p) for n, p in named.items() if HIDDEN.fullmatch(n)}
    assert len(hidden) == 4 * cfg.model_shape["n_layer"]
    muon, adamw = ids(optimizer.muon.param_groups), ids(optimizer.adamw.param_groups)
    assert sorted(muon) == sorted(hidden)  # each once
    assert sorted(adamw) == sorted(id(p) for p in named.values() if id(p) not in hidden)
    assert id(raw.transformer.wte.weight) in adamw and id(raw.lm_head.weight) in adamw
    assert ids(optimizer.param_groups) == muon + adamw  # what train_step, GradScaler and the schedule see


def hand_built(model, cfg):
    """torch.optim.Muon and AdamW on the split, written out by name, with the settings passed one by one."""
    named = dict(model.named_parameters())
    hidden = [p for n, p in named.items() if HIDDEN.fullmatch(n)]
    decay = [named["transformer.wte.weight"]]  # the tied lm_head: the one Linear weight outside the blocks
    rest = [p for n, p in named.items() if not HIDDEN.fullmatch(n) and n != "transformer.wte.weight"]
    muon = torch.optim.Muon(hidden, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay)
    adamw = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=cfg.betas,
        foreach=cfg.optimizer_foreach,
    )
    return muon, adamw


@needs_muon
def test_steps_equal_torch_muon_and_adamw_built_by_hand(char_data):
    """The combined optimizer's steps equal torch's Muon and AdamW built by hand, bit for bit.

    Bit-identical: the same kernels on the same tensors. Two steps, so Muon's momentum and AdamW's moments count; after
    a schedule's scaling too."""
    cfg, raw, optimizer = built(char_data, n_layer=2, lr_decay_tokens=10_000)
    twin = copy.deepcopy(raw)
    muon, adamw = hand_built(twin, cfg)
    gen = torch.Generator().manual_seed(0)
    for step in range(2):
        for p, q in zip(raw.parameters(), twin.parameters()):
            p.grad = torch.randn(p.shape, generator=gen)
            q.grad = p.grad.clone()
        optimizer.step()
        with newton_schulz_in(optimizer.newton_schulz_dtype):  # this device's Newton-Schulz precision
            muon.step()
        adamw.step()
        for (name, p), q in zip(raw.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), f"step {step}: {name}"
        set_learning_rates(optimizer, cfg, 9_000)  # the second step at the schedule's lr
        for g in adamw.param_groups:
            g["lr"] = learning_rate(cfg, 9_000)
        for g in muon.param_groups:
            g["lr"] = learning_rate(cfg, 9_000) * (cfg.muon_lr / cfg.lr)
    assert all(torch.count_nonzero(p.grad) for p in raw.parameters())


@needs_muon
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])  # a CPU with fast bf16, and one without
def test_batched_newton_schulz_steps_equal_torch_muon_bit_for_bit(char_data, bf16, monkeypatch):
    """speedrun_18's BatchedMuon steps the blocks' matrices exactly as torch's Muon does, to the last bit.

    Bit-identical: each matrix of a stack is normalised by its own norm and multiplied by the same products, only
    batched, so the tolerance is zero; an error in the stacking (one norm for the whole stack, a transpose lost, a
    matrix's update given to another of its shape) moves every matrix by about the step itself. The optimizers
    build_model makes with and without muon_batched, from the same weights and gradients, three steps (Muon's momentum
    counts), at gpt-mini's 2 blocks: 8 matrices of 4 shapes, two of each, a tall, a wide and a square among them."""
    monkeypatch.setattr("gpt.optimizations.precision.cpu_bf16_is_faster", lambda: (bf16, "as parametrized"))
    _, reference, torch_muon = built(char_data, n_layer=2)
    _, raw, batched = built(char_data, n_layer=2, muon_batched=True)
    assert isinstance(batched.muon, BatchedMuon) and type(torch_muon.muon) is torch.optim.Muon
    assert batched.muon.newton_schulz_dtype == (torch.bfloat16 if bf16 else torch.float32)
    shapes = [p.shape for g in batched.muon.param_groups for p in g["params"]]
    assert len(shapes) == 8 and len(set(shapes)) == 4
    generator = torch.Generator().manual_seed(0)
    for step in range(3):
        before = [p.detach().clone() for p in raw.parameters()]
        for p, q in zip(reference.parameters(), raw.parameters()):
            p.grad = torch.randn(p.shape, generator=generator)
            q.grad = p.grad.clone()
        torch_muon.step()
        batched.step()
        for (name, p), q, b in zip(reference.named_parameters(), raw.parameters(), before):
            assert torch.equal(p, q), f"step {step}: {name}"
            assert not torch.equal(q, b), f"step {step}: {name} did not move"


@needs_muon
def test_grad_scaler_unscales_and_steps_both_optimizers(char_data):
    """fp16's GradScaler reaches Muon's and AdamW's gradients through the one optimizer.

    unscale_ divides every gradient by the scale, and step skips both optimizers on an overflow."""
    cfg, raw, optimizer = built(char_data, n_layer=2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale(torch.ones(()))  # as a scaled loss would: the scale is made on first use
    grads = {}
    for p in raw.parameters():
        p.grad = torch.full_like(p, 1024.0)
        grads[p] = p.detach().clone()
    scaler.unscale_(optimizer)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in raw.parameters())
    scaler.step(optimizer)
    assert all(not torch.equal(p, grads[p]) for p in raw.parameters())  # both stepped
    scaler.update()
    before = [p.detach().clone() for p in raw.parameters()]
    for p in raw.parameters():
        p.grad = torch.full_like(p, math.inf)
    scaler.step(optimizer)  # an overflow: neither steps
    assert all(torch.equal(p, b) for p, b in zip(raw.parameters(), before))


# ---- bad settings: one line, exit 2, through a stage script -------------------------------------------------


def run_stage_with(char_data, tmp_path, setup: str = "", **overrides) -> subprocess.CompletedProcess:
    """speed_0_baseline's script as a user runs it, for 2 steps, with TrainConfig overrides applied as a stage would.

    The overrides as stage_config applies them: the config is validated after them. Two steps: a setting wrongly let
    through fails fast. `setup` runs first (e.g. a torch without Muon)."""
    code = (
        f"import sys, torch\nfrom math import inf, nan\n{setup}\nfrom gpt import stage\nreal = stage.stage_config\n"
        f"stage.stage_config = lambda *a, **k: real(*a, **{{**k, **{overrides!r}}})\n"
        f"stage.stage_main({str(REPO / 'stages' / 'speed_0_baseline.py')!r})"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *stage_argv(char_data, tmp_path)], capture_output=True, text=True, timeout=120
    )


def stage_argv(char_data, tmp_path) -> list[str]:
    """speed_0_baseline's command line in run_stage_with: the smoke profile, 256 tokens to a loss, into tmp_path/out."""
    return [
        "--profile",
        "smoke",
        "--device",
        "cpu",
        "--time-to-loss",
        "--train-tokens",
        "256",
        "--data-dir",
        str(char_data),
        "--out",
        str(tmp_path / "out"),
        "--wandb",
        "disabled",
    ]


BAD_SETTINGS = [
    (dict(matrix_optimizer="sgd"), "unknown matrix_optimizer 'sgd' (choose adamw or muon)"),
    (dict(matrix_optimizer="muon", muon_lr=0.0), "muon_lr must be a positive number, got 0.0"),
    (dict(matrix_optimizer="muon", muon_lr=math.inf), "muon_lr must be a positive number, got inf"),
    (dict(matrix_optimizer="muon", muon_momentum=1.0), "muon_momentum must be in [0, 1), got 1.0"),
    (dict(matrix_optimizer="muon", muon_weight_decay=-0.1), "muon_weight_decay must be >= 0, got -0.1"),
    (dict(matrix_optimizer="muon", muon_batched="yes"), "muon_batched must be true or false, got 'yes'"),
    (dict(muon_batched=True), "muon_batched batches Muon's Newton-Schulz iterations: it needs matrix_optimizer='muon'"),
    (dict(lr_schedule="step"), "unknown lr_schedule 'step' (choose cosine or wsd)"),
    (dict(lr_schedule="wsd"), "wsd needs 0 < lr_cooldown <= 1"),
    (dict(lr_schedule="wsd", lr_cooldown=1.5), "wsd needs 0 < lr_cooldown <= 1"),
    (dict(lr_schedule="wsd", lr_cooldown=1.0), "before the warm-up ends"),
    (dict(lr_cooldown=0.2), "lr_cooldown (0.2) is wsd's setting"),
    (dict(lr=0.0, min_lr=0.0), "the learning rate must be a positive number, got 0.0"),
]


def test_a_bad_setting_is_one_line_and_exit_2_from_the_stage_script(char_data, tmp_path):
    """A bad setting ends the stage script, run as a user runs it, with exit 2 and one line on stderr, and no record.

    One setting end to end (a fresh process: nothing else on stderr); each of the others in this process below."""
    overrides, message = BAD_SETTINGS[0]
    r = run_stage_with(char_data, tmp_path, **overrides)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert not list((tmp_path / "out").rglob("*.json"))


@pytest.mark.parametrize("overrides, message", BAD_SETTINGS)
def test_bad_settings_are_one_line_and_exit_2(overrides, message, char_data, tmp_path, monkeypatch, capsys):
    """Each bad setting: the stage script's entry point (stage_main) exits 2 with its one line, before any training.

    The overrides applied as run_stage_with applies them, in this process; a setting wrongly let through would train
    its 256 tokens and exit 0."""
    from gpt import stage

    real = stage.stage_config
    monkeypatch.setattr(stage, "stage_config", lambda *a, **k: real(*a, **{**k, **overrides}))
    with pytest.raises(SystemExit) as e:
        stage.stage_main(str(REPO / "stages" / "speed_0_baseline.py"), stage_argv(char_data, tmp_path))
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines
    assert not list((tmp_path / "out").rglob("*.json"))


def test_muon_with_fsdp_is_refused():
    with pytest.raises(UserError, match="Muon needs whole matrices and FSDP shards them"):
        optimizations.validate(TrainConfig(device="cpu", matrix_optimizer="muon", distributed="fsdp", nproc=2))


def test_a_torch_without_muon_records_the_stage_as_skipped(char_data, tmp_path):
    r = run_stage_with(char_data, tmp_path, "del torch.optim.Muon" if HAS_MUON else "", matrix_optimizer="muon")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3 and len(lines) == 1, r.stderr  # gpt/stage.py's EXIT_SKIPPED
    assert "cannot run here: Muon needs torch.optim.Muon (PyTorch 2.9 or newer" in lines[0]
    assert list((tmp_path / "out").rglob("*.json"))  # the skipped record


# ---- a real run ---------------------------------------------------------------------------------------------


@needs_muon
def test_a_muon_run_with_wsd_learns(char_data):
    """A run to a loss with Muon and wsd (the smoke profile's, 60 steps) learns.

    The validation loss falls well below its start (ln 65 = 4.17; 0.6 lower after 30 steps here)."""
    budget = 60 * 4 * 32
    cfg = smoke_to_a_loss(
        char_data,
        matrix_optimizer="muon",
        lr_schedule="wsd",
        lr_cooldown=0.5,
        train_tokens=budget,
        lr_decay_tokens=budget,
    )
    curve = [p["val_loss"] for p in time_to_loss.run(cfg)["metrics"]["curve"]]
    assert curve[-1] < curve[0] - 0.5, curve


@needs_muon
def test_a_cpu_without_fast_bf16_runs_newton_schulz_in_float32(char_data, monkeypatch):
    """On a CPU without fast bf16, Muon's step runs Newton-Schulz in float32.

    torch's Muon orthogonalises in bf16, hard-coded; where this CPU's bf16 is slower (emulated), the step swaps in the
    same iteration in float32 for Muon's step only. Its result is torch's up to bf16 rounding (measured ~1e-2 of the
    largest entry: bound 5e-2), and the swap is undone after the step."""
    from torch.optim import _muon

    from gpt.optimizations import muon as home

    g = torch.randn(96, 32, generator=torch.Generator().manual_seed(0))
    fp32, bf16 = (
        newton_schulz_fp32(g, (3.4445, -4.7750, 2.0315), 5, 1e-7),
        _muon._zeropower_via_newtonschulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7),
    )
    assert fp32.dtype == torch.float32 and fp32.shape == g.shape
    assert ((fp32 - bf16.float()).abs().max() / fp32.abs().max()).item() < 5e-2
    monkeypatch.setattr("gpt.optimizations.precision.cpu_bf16_is_faster", lambda: (False, "slower here"))
    cfg, raw, optimizer = built(char_data, n_layer=2)
    assert optimizer.newton_schulz_dtype == torch.float32
    calls = []
    real = home.newton_schulz_fp32
    monkeypatch.setattr(home, "newton_schulz_fp32", lambda *a: calls.append(a[0].shape) or real(*a))
    for p in raw.parameters():
        p.grad = torch.randn_like(p)
    original = _muon._zeropower_via_newtonschulz
    optimizer.step()
    assert len(calls) == 4 * 2  # the four matrices of each of the two blocks
    assert _muon._zeropower_via_newtonschulz is original
    monkeypatch.setattr("gpt.optimizations.precision.cpu_bf16_is_faster", lambda: (True, "faster here"))
    assert built(char_data, n_layer=2)[2].newton_schulz_dtype == torch.bfloat16


# ---- Newton-Schulz in bf16: on the CPU here, on CUDA in tests/test_gpu.py ----------------------------------------

# The bound on bf16's error in Newton-Schulz's result, in spectral norm (the result's own is at most ~1.2). bf16 keeps
# 8 significant bits: a rounding errs by at most u = 2^-8 of the value. Each of the 5 iterations rounds about four
# matrices of spectral norm ~1 to bf16 (X, X Xᵀ, the quintic's b XXᵀ + c (XXᵀ)², the new X), so the result carries
# ~20 roundings; added up as if none cancelled, 20 u = 0.078. Measured on this CPU's bf16 (fp32 accumulation, as
# cuBLAS): 0.025 to 0.041 (shapes 256x1024, 1024x256, 96x32, 32x128, 3 seeds each). An iteration fewer moves the
# result by 0.096 to 0.45, none at all by ~1.
NEWTON_SCHULZ_BF16 = 20 * 2**-8


# What the quintic's coefficients aim for (Keller Jordan's Muon; torch/optim/_muon.py): not U Vᵀ itself but U S' Vᵀ
# with S' within about (0.5, 1.5); here p⁵ gives 0.68 to 1.14 for every singular value above 1% of |G|_F.
ORTHOGONAL_BAND = (0.5, 1.5)


def muon_defaults() -> dict:
    """torch.optim.Muon's own settings (ns_coefficients, ns_steps, eps, ...): those every Muon step uses."""
    return torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults


def check_newton_schulz_in_bf16(device: str) -> None:
    """torch's Newton-Schulz orthogonalisation as Muon runs it on `device` (bf16), against exact arithmetic and float32.

    In exact arithmetic it keeps the singular vectors of G and sends each singular value s of G / |G|_F through the
    quintic p(s) = a s + b s³ + c s⁵, ns_steps times: the result's singular values are p⁵(s), computed here in float64.
    bf16's result has them within NEWTON_SCHULZ_BF16 (Weyl: no singular value moves by more than the spectral norm of
    the error) and inside ORTHOGONAL_BAND, and differs from the same iteration in float32 on the CPU by less than
    NEWTON_SCHULZ_BF16."""
    from torch.optim import _muon

    settings = muon_defaults()
    (a, b, c), steps, eps = settings["ns_coefficients"], settings["ns_steps"], settings["eps"]
    for shape in ((256, 1024), (1024, 256)):  # wide, and tall (the iteration runs on its transpose)
        g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        out = _muon._zeropower_via_newtonschulz(g.to(device), (a, b, c), steps, eps)
        assert out.dtype == torch.bfloat16 and out.device.type == device and out.shape == g.shape
        out = out.cpu().double()
        s = torch.linalg.svdvals(g.double()) / g.double().norm()
        for _ in range(steps):
            s = a * s + b * s**3 + c * s**5
        singular = torch.linalg.svdvals(out)
        low, high = ORTHOGONAL_BAND
        assert low < singular.min() and singular.max() < high, (shape, singular.min(), singular.max())
        error = (singular - s.sort(descending=True).values).abs().max().item()
        assert error < NEWTON_SCHULZ_BF16, (shape, error)
        fp32 = newton_schulz_fp32(g, (a, b, c), steps, eps).double()
        assert torch.linalg.matrix_norm(out - fp32, ord=2).item() < NEWTON_SCHULZ_BF16, shape


def check_a_bf16_muon_step_matches_fp32_on_the_cpu(char_data, device: str, monkeypatch, **overrides) -> None:
    """One step of the optimizer build_model makes, Newton-Schulz in bf16 on `device`, against float32 on the CPU.

    The model is gpt-mini with 2 blocks; both steps start from the same weights and gradients. A Muon matrix moves by
    -lr' O (O: the orthogonalised momentum; lr' = muon_lr sqrt(max(1, rows/cols)), torch's default adjustment), and the
    momentum is float32 on both, so the two differ by lr' |O_bf16 - O_fp32| <= lr' NEWTON_SCHULZ_BF16 in spectral norm,
    plus float32's rounding of the sum (~1e-7 of weights of norm ~10: 1e-5 allowed); the step itself moves each by lr'
    |O| >= 0.5 lr', several times the bound. AdamW's parameters (float32 on both) are equal to float32's rounding; its
    step moved them by ~lr."""
    monkeypatch.setattr("gpt.optimizations.precision.cpu_bf16_is_faster", lambda: (False, "the fp32 reference"))
    cfg, reference, reference_optimizer = built(char_data, n_layer=2)
    assert reference_optimizer.newton_schulz_dtype == torch.float32
    if device == "cpu":  # the CPU twin: bf16 Newton-Schulz on the CPU, as a CPU with fast bf16 runs it
        monkeypatch.setattr("gpt.optimizations.precision.cpu_bf16_is_faster", lambda: (True, "bf16 on the CPU"))
    _, raw, optimizer = built(char_data, device, n_layer=2, **overrides)  # overrides: on the device's side only
    assert optimizer.newton_schulz_dtype == torch.bfloat16
    generator = torch.Generator().manual_seed(0)
    before = {}
    for (name, p), q in zip(reference.named_parameters(), raw.parameters()):
        assert torch.equal(p, q.cpu()), name  # the same start
        p.grad = torch.randn(p.shape, generator=generator)
        q.grad = p.grad.to(q.device)
        before[name] = p.detach().clone()
    reference_optimizer.step()
    optimizer.step()
    for (name, p), q in zip(reference.named_parameters(), raw.parameters()):
        q, moved = q.detach().cpu(), (p - before[name]).double()
        if HIDDEN.fullmatch(name):
            rows, cols = p.shape
            bound = cfg.muon_lr * math.sqrt(max(1, rows / cols)) * NEWTON_SCHULZ_BF16 + 1e-5
            assert torch.linalg.matrix_norm((q - p).double(), ord=2).item() < bound, name
            assert torch.linalg.matrix_norm(moved, ord=2).item() > 5 * bound, name
        else:
            torch.testing.assert_close(q, p, msg=name)
            assert moved.abs().max().item() > 0.5 * cfg.lr, name


@needs_muon
def test_newton_schulz_in_bf16_on_the_cpu_is_near_orthogonal_and_near_float32():
    check_newton_schulz_in_bf16("cpu")


@needs_muon
@pytest.mark.parametrize("batched", [False, True], ids=["torch", "batched"])  # tests/test_gpu.py runs both on CUDA
def test_a_muon_step_with_bf16_newton_schulz_matches_float32(char_data, monkeypatch, batched):
    check_a_bf16_muon_step_matches_fp32_on_the_cpu(char_data, "cpu", monkeypatch, muon_batched=batched)

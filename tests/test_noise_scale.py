"""The gradient noise scale (gpt/noise_scale.py): its estimator, halves trick, batch choice and command.

The estimator against a synthetic case with a closed-form answer, the halves trick (the plain step's update; the halves'
own squared norms), the batch choice on a hand-made t(B), a smoke measurement end to end, and one line for bad input."""

import json
import math
import statistics
import subprocess
import sys
from types import SimpleNamespace

import pytest
import sympy
import torch
from conftest import REPO

from gpt import noise_scale, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.ladder import stage_config
from gpt.noise_scale import HalvesNorms, b_simple, choose_batch, ema, halves_config, step_estimates, suggested_settings
from gpt.optimizations import chunked_loss
from gpt.optimizations.feeding import to_device
from gpt.report.speedrun import plot_noise_scale


def smoke_config(char_data, **overrides):
    return stage_config("speed_0_baseline", "smoke", True, data_dir=str(char_data), device="cpu", **overrides)


# ---- the estimator ------------------------------------------------------------------------------------------


def test_estimator_recovers_trace_sigma_over_grad_sq():
    """The estimator recovers B_simple = tr(Sigma) / |G|^2 from per-sample gradients with a known noise.

    Per-sample gradients g_i = G + xi_i, xi_i ~ N(0, Sigma) with |G|^2 = 1 and tr(Sigma) = 40: B_simple -> 40. The
    tolerance is four standard errors of the two means over the draws (their relative errors added); at B = 16 the
    per-draw |G|^2 estimate is often near 0 or negative, so averaging the per-draw ratios instead fails, and so does
    swapping the small and big batch."""
    torch.manual_seed(0)
    dim, b_big, b_small, draws = 64, 16, 8, 4000
    grad = torch.randn(dim, dtype=torch.float64)
    grad /= grad.norm()  # |G|^2 = 1
    variances = torch.rand(dim, dtype=torch.float64) + 0.5
    variances *= 40 / variances.sum()  # tr(Sigma) = 40
    samples = grad + torch.randn(draws, b_big, dim, dtype=torch.float64) * variances.sqrt()
    halves = samples.reshape(draws, 2, b_small, dim).mean(2)
    small_sq = halves.square().sum(-1).mean(1)  # the mean of the halves' squared norms
    big_sq = samples.mean(1).square().sum(-1)
    g2, s = step_estimates(small_sq, big_sq, b_small, b_big)
    g2, s = g2.tolist(), s.tolist()
    se_g2 = statistics.stdev(g2) / math.sqrt(draws) / statistics.fmean(g2)
    se_s = statistics.stdev(s) / math.sqrt(draws) / statistics.fmean(s)
    tolerance = 4 * (se_g2 + se_s)
    assert tolerance < 0.15  # the test can tell a right answer from a wrong one
    assert statistics.fmean(g2) == pytest.approx(1.0, rel=4 * se_g2)
    assert statistics.fmean(s) == pytest.approx(40.0, rel=4 * se_s)
    assert b_simple(g2, s) == pytest.approx(40.0, rel=tolerance)


def test_moving_average_is_bias_corrected():
    """The moving average is bias-corrected: a constant stays constant from the first step.

    No pull towards the zero it starts from; a step change relaxes with the time constant."""
    assert ema([3.0] * 50, 10) == pytest.approx([3.0] * 50)
    after = ema([0.0] * 200 + [1.0] * 10, 10)
    assert after[-1] == pytest.approx(1 - 0.9**10, rel=1e-6)


# ---- the halves trick ---------------------------------------------------------------------------------------


def test_halves_give_the_plain_update_and_read_the_halves_norms(char_data):
    """A step trained as two halves gives the plain step's update and records the halves' squared norms.

    One step of speed_0 (smoke): the parameters after it equal the plain step's within float rounding, and the recorded
    squared norms equal the halves' and the batch's gradients computed apart."""
    cfg = smoke_config(char_data, batch_size=8)
    device = torch.device("cpu")
    probe = train.prepare(cfg, device, 1, "probe")  # the same seed: the same initial weights and first batch
    x, y = to_device(next(probe.batches), device, cfg)
    grads = []
    for xs, ys in ((x[:4], y[:4]), (x[4:], y[4:]), (x, y)):
        _, loss = probe.gpt(xs, ys)
        grads.append(torch.autograd.grad(loss, list(probe.gpt.parameters())))
    g_a, g_b, g = (sum(t.double().square().sum() for t in gs) for gs in grads)

    plain = train.prepare(cfg, device, 1, "plain")
    halves = train.prepare(halves_config(cfg), device, 1, "halves")
    params = list(halves.model.parameters())
    norms = HalvesNorms(params, cfg.grad_accum_steps, 1, lambda: halves.steps_done, device)
    before = [p.detach().clone() for p in params]
    plain.run(1)
    halves.run(1)
    norms.remove()
    for p, q, _ in zip(plain.model.parameters(), params, before):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(q, b) for q, b in zip(params, before))  # the step moved the weights
    small_sq, big_sq = norms.norms[0].tolist()
    assert small_sq == pytest.approx(((g_a + g_b) / 2).item(), rel=1e-5)
    assert big_sq == pytest.approx(g.item(), rel=1e-5)
    assert small_sq > big_sq  # halves are noisier than their mean


def test_a_batch_that_does_not_split_into_halves_is_refused(char_data):
    with pytest.raises(UserError, match="does not split into 2 x"):
        halves_config(smoke_config(char_data, batch_size=5, samples=20))


# ---- the choice ---------------------------------------------------------------------------------------------


def test_choose_batch_minimises_the_predicted_time():
    """(1 + 32/B) t(B) on t = {8: 1.0, 16: 1.2, 32: 2.0, 64: 4.0}: 5.0, 3.6, 4.0, 6.0 -> batch 16, 5.0/3.6 sooner."""
    choice = choose_batch(32.0, {8: 1.0, 16: 1.2, 32: 2.0, 64: 4.0}, baseline=8)
    assert choice["batch"] == 16
    assert choice["speedup"] == pytest.approx(5.0 / 3.6)
    assert choice["relative_time"] == pytest.approx({8: 1.0, 16: 0.72, 32: 0.8, 64: 1.2})
    assert choice["tokens_factor"] == pytest.approx((1 + 16 / 32) / (1 + 8 / 32))


def test_suggested_settings_follow_the_square_root_rule(char_data):
    cfg = smoke_config(char_data)  # batch 4, lr 1e-3, beta2 0.99
    s = suggested_settings(cfg, 16)
    assert s["lr"] == pytest.approx(2 * cfg.lr) and s["min_lr"] == pytest.approx(2 * cfg.min_lr)
    assert s["beta2"] == pytest.approx(cfg.betas[1] ** 4)  # the same half-life in tokens


# ---- the command line, end to end ---------------------------------------------------------------------------


def test_where_the_timed_stage_cannot_run_it_stops_in_one_line_before_training(char_data, tmp_path, monkeypatch):
    """Where the timed stage cannot run, the command says why in one line, before any training.

    t(B) is timed with speedrun_1's code: where that cannot run, the command stops at once (it once measured the whole
    curve, minutes, then died building that stage)."""
    monkeypatch.setattr(noise_scale.optimizations, "why_cannot_run", lambda cfg, device_type: "it needs two GPUs")
    monkeypatch.setattr(noise_scale, "measure", lambda *a, **k: pytest.fail("trained before saying it cannot run"))
    with pytest.raises(SystemExit) as e:
        noise_scale.main(
            [
                "--profile",
                "smoke",
                "--device",
                "cpu",
                "--data-dir",
                str(char_data),
                "--batches",
                "4,8",
                "--out",
                str(tmp_path / "noise.json"),
            ]
        )
    assert e.value.code == 2 and not (tmp_path / "noise.json").exists()


def test_on_a_torch_without_the_chunked_op_t_b_is_timed_with_the_full_loss(monkeypatch):
    """On a torch without the chunked op, t(B) is timed with the full loss, and the noise scale runs.

    torch 2.11 has no F.linear_cross_entropy: speedrun_1, a run for time at the character vocabulary, computes the full
    loss there as everywhere (chunked_loss.narrow_vocabulary_rule)."""
    monkeypatch.setattr(chunked_loss, "torch_op_takes_our_call", lambda: False)  # as on torch 2.11
    timed = stage_config(noise_scale.TIMED_WITH, "smoke", device="cpu")
    assert noise_scale.optimizations.why_cannot_run(timed, "cpu") is None
    assert chunked_loss.loss_used(timed, "cpu", 65)[0] == "full"


def smoke_args(char_data, device: str, out, *more: str) -> list[str]:
    """The command line of `python -m gpt.noise_scale` on the smoke profile on `device`, t(B) at batches 4 and 8."""
    return [
        "--profile",
        "smoke",
        "--device",
        device,
        "--data-dir",
        str(char_data),
        "--batches",
        "4,8",
        "--out",
        str(out),
        *more,
    ]


def measure_smoke(char_data, device: str, out) -> dict:
    """`python -m gpt.noise_scale` on the smoke profile on `device` (smoke_args): its record, written to `out`.

    Where the device has no chunked loss, speedrun_1's code computes the full loss: chunked_loss.loss_used."""
    assert noise_scale.main(smoke_args(char_data, device, out)) == 0
    return json.loads(out.read_text())


def check_smoke_measurement(record: dict) -> None:
    """A measurement's record holds a finite positive B_noise, a finite curve and step times, and a chosen batch.

    B_noise is a finite positive number of samples (S / |G|^2 over the last quarter of the smoke run; on this CPU its
    |G|^2 estimate is 0.39, 3.7 standard errors of the window's mean above 0, and B_noise 9.0; another device trains on
    the same batches from the same weights), every B_simple on the curve finite, a finite positive step time for each
    batch and a choice among them."""
    b_noise = record["window"]["b_noise"]
    assert math.isfinite(b_noise) and b_noise > 0, record["window"]
    assert all(math.isfinite(p["b_simple"]) for p in record["curve"][1:])
    assert [p["step"] for p in record["curve"]] == [0, 30, 60, 90, 120, 150]
    assert set(record["step_times"]) == {"4", "8", "16"}  # --batches, and speedrun_2's batch on the smoke profile
    assert all(math.isfinite(t) and t > 0 for t in record["step_times"].values())
    assert record["choice"]["batch"] in (4, 8, 16)


def test_smoke_measurement_runs_end_to_end(char_data, tmp_path, capsys, monkeypatch):
    """The whole noise scale command runs end to end on the smoke profile, with t(B) eager.

    t(B) is eager because each batch would compile its own graphs, two thirds of this test's time: the compiled step is
    speedrun_1's, which the ladder runs; tests/test_gpu.py compiles it."""
    timed = noise_scale.step_times
    monkeypatch.setattr(
        noise_scale,
        "step_times",
        lambda cfg, *a, **k: timed(TrainConfig.from_dict({**cfg.to_dict(), "compile": False}), *a, **k),
    )
    out = tmp_path / "noise.json"
    record = measure_smoke(char_data, "cpu", out)
    check_smoke_measurement(record)
    assert "chosen batch" in capsys.readouterr().out
    plot_noise_scale(record, tmp_path / "noise.png")
    assert (tmp_path / "noise.png").stat().st_size > 0

    # again with --reuse: the curve is the record's (no training), the step times are measured anew
    monkeypatch.setattr(noise_scale, "measure", lambda *a, **k: pytest.fail("the curve was measured again"))
    again = tmp_path / "again.json"
    assert noise_scale.main(smoke_args(char_data, "cpu", again, "--reuse", str(out))) == 0
    reused = json.loads(again.read_text())
    assert reused["curve"] == record["curve"] and reused["window"] == record["window"]
    assert reused["reused_from"] == str(out) and reused["provenance"] == record["provenance"]
    assert set(reused["step_times"]) == {"4", "8", "16"} and reused["env"]["time"] >= record["env"]["time"]
    assert "were computed on" in noise_scale.summary_line(reused) and "were computed" not in noise_scale.summary_line(
        record
    )
    # measured with another profile's settings: not reused
    other = {**record, "provenance": {**record["provenance"], "key": {**record["provenance"]["key"], "profile": "cpu"}}}
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        noise_scale.main(smoke_args(char_data, "cpu", again, "--reuse", str(tmp_path / "other.json")))


def test_step_times_compile_each_batch_with_static_shapes(char_data, traced_not_compiled, monkeypatch):
    """t(B) times each batch on the graph its own stage would run: compiled for that batch alone.

    Without a reset, Dynamo marks the batch dimension dynamic at the second size and times it on a dynamic-shape graph
    (symbols created for the sizes): the first t(B) of 2026-11-26 timed batches 24, 48 and 96 that way."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    symbols = []  # the sizes Dynamo made symbolic (a static size is created as a constant)
    create = ShapeEnv.create_symbol

    def create_and_note(self, val, *args, **kwargs):
        made = create(self, val, *args, **kwargs)
        if isinstance(made, sympy.Symbol):
            symbols.append(val)
        return made

    monkeypatch.setattr(ShapeEnv, "create_symbol", create_and_note)
    cfg = stage_config(noise_scale.TIMED_WITH, "smoke", data_dir=str(char_data), device="cpu", n_layer=1)
    assert cfg.compile
    times = noise_scale.step_times(cfg, [2, 4], warmup=1, repeats=2)
    assert set(times) == {2, 4} and all(t > 0 for t in times.values())
    assert symbols == []  # every size a constant: static graphs


def test_step_times_are_timed_as_training_is(char_data, monkeypatch):
    """Step times are timed as training is: the device is synchronised at the ends of a stretch of steps.

    Training to a loss synchronises the device at the ends of a stretch of steps, not between them (no step waits for
    the one before to finish on the device): t(B) is timed the same way, once before the timed steps and once after,
    their mean. A clock that ticks once a second on every reading: one stretch of 4 steps reads it twice (1 s: 0.25 s a
    step); a clock read between steps gives 1 s a step."""
    from gpt import time_to_loss

    ticks, synchronized = iter(range(10**6)), []
    for module in (noise_scale, time_to_loss):  # wherever the clock is read (the feed's own clock is left alone)
        monkeypatch.setattr(module, "time", SimpleNamespace(perf_counter=lambda: next(ticks)), raising=False)
        monkeypatch.setattr(module, "synchronize", synchronized.append, raising=False)
    cfg = smoke_config(char_data, n_layer=1, compile=False)
    times = noise_scale.step_times(cfg, [2], warmup=1, repeats=4)
    assert len(synchronized) <= 2
    assert times == {2: pytest.approx(0.25)}


def test_a_curve_measured_on_a_gpu_names_the_gpu(char_data, tmp_path, monkeypatch):
    """The record of a run on a GPU names the GPU as the machine of its curve and step times, not the host's CPU.

    The curve's machine is what a reused curve's note in the report says it was computed on. A CPU stands in for the
    GPU: the device resolves to CUDA, torch names it, and the curve and step times are made up (nothing runs on it)."""
    from gpt.devices import cpu_model

    gpu = "NVIDIA H100 80GB HBM3"
    assert gpu != cpu_model()
    monkeypatch.setattr(noise_scale, "resolve_device", lambda name: torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    monkeypatch.setattr(noise_scale.optimizations, "why_cannot_run", lambda cfg, device_type: None)
    monkeypatch.setattr(
        noise_scale,
        "measure",
        lambda cfg: noise_scale.noise_record(cfg, [3.0] * 8, [2.0] * 8, [(0, 4.0), (4, 3.5), (8, 3.0)]),
    )  # |G|^2 1, tr(Sigma) the batch: B_noise > 0
    monkeypatch.setattr(noise_scale, "step_times", lambda cfg, batches: {b: 0.01 * b for b in batches})
    out = tmp_path / "noise.json"
    assert (
        noise_scale.main(["--profile", "smoke", "--data-dir", str(char_data), "--batches", "4,8", "--out", str(out)])
        == 0
    )
    record = json.loads(out.read_text())
    assert (record["provenance"]["machine"], record["device"]) == (gpu, gpu)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batches", "12,x"], "--batches takes batch sizes"),
        (["--batches", "0,12"], "--batches must all be at least 1"),
        (["--profile", "nope"], "unknown profile"),
        (["--device", "tpu"], "unknown device"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        noise_scale.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_module_runs_as_a_command():
    r = subprocess.run(
        [sys.executable, "-m", "gpt.noise_scale", "--batches", "twelve"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --batches takes batch sizes separated by commas (e.g. 12,24,48), got 'twelve'"
    ]


@pytest.mark.parametrize("profile", ["reference", "cpu"])
def test_t_b_covers_the_batch_the_stage_trains_at(profile):
    """t(B) covers the batch the stage trains at: by default 1-8 times the baseline's batch.

    speedrun_2 trains at 48 on every profile (the speedrun's task, speed_0's 12 x4): t(B) times it. The fixed 12-96
    (plus 32) of before left out the 128 it once trained at on the reference profile."""
    baseline = stage_config(noise_scale.BASELINE, profile, speedrun_task=True).batch_size
    stage = stage_config(noise_scale.CHOOSES_FOR, profile).batch_size
    batches = noise_scale.timed_batches(baseline, stage, None)
    assert stage in batches and batches == [baseline * m for m in (1, 2, 4, 8)]
    assert noise_scale.timed_batches(baseline, stage, "5,7") == sorted({5, 7, baseline, stage})

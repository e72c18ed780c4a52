"""Training to a loss (gpt/time_to_loss.py): its schedule, windows, time-to-target rule, learning and report marks.

The schedule, the held-out windows, evaluation that leaves training alone, the time-to-target rule, real learning on the
smoke profile, the "changes convergence" mark with a negative control, W&B's curves, and one line for bad input. About a
minute in all."""

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import astuple
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import REPO, free_port, smoke_stage_argv
from equivalence import tiny_config
from record_schema import record_problems

from gpt import evaluation, optimizations, time_to_loss, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.evaluation import ValidationSet, WindowSums, estimate_windows, window_sums
from gpt.ladder import stage_config, stages_of
from gpt.loss_curve import changes_convergence, crossing, seed_spread, target_from, val_loss_at
from gpt.optimizations.schedule import learning_rate
from gpt.report.time_to_loss import LossRuns, kept_model_findings, loss_findings, loss_section, loss_table
from gpt.run_choices import RunChoices
from gpt.settings_profiles import profile_settings
from gpt.stage import parse_args, stage_main, to_a_loss_overrides


def smoke_to_a_loss(char_data, stage="speed_0_baseline", **overrides) -> TrainConfig:
    """The smoke profile's settings for training to a loss, on the tests' excerpt, on the CPU."""
    return stage_config(stage, "smoke", True, data_dir=str(char_data), device="cpu", **overrides)


# The stages trained to a loss in the tests, on the CPU here and on CUDA in tests/test_gpu.py: eager fp32, mixed
# precision, the compiled stage with fused AdamW.
LEARNING_STAGES = ("speed_0_baseline", "speed_5_amp", "fast_5_fused_adamw")
LEARNING_STEPS = 150  # the smoke baseline's budget in optimizer steps: ~4.4 -> ~3.2 on its excerpt


def learning_budget(stage: str, data_dir, device: str, steps: int = LEARNING_STEPS, **settings) -> TrainConfig:
    """The smoke profile's run to a loss with a budget of `steps` optimizer steps for `stage` itself.

    The budget goes through --train-tokens (the schedule follows it). The profile's budget is in tokens of the
    baseline's batch: a stage after speed_1's batch x8 gets 8x fewer steps of it (18), too few to learn on (~4.2 ->
    ~3.8)."""
    cfg = stage_config(stage, "smoke", True, data_dir=str(data_dir), device=device)
    budget = steps * cfg.tokens_per_step
    evals = profile_settings("smoke", "time_to_loss")["train_tokens"] // cfg.eval_every_tokens  # the profile's 5
    args = parse_args(
        stage, ["--time-to-loss", "--train-tokens", str(budget), "--eval-every-tokens", str(budget // evals)]
    )
    overrides = to_a_loss_overrides(args, profile_settings("smoke", "time_to_loss"))
    return stage_config(stage, "smoke", True, data_dir=str(data_dir), device=device, **overrides, **settings)


@pytest.mark.slow
@pytest.mark.parametrize("stage", LEARNING_STAGES)
def test_each_stage_trained_to_a_loss_in_the_tests_learns_on_its_budget(stage, char_data):
    """Each stage trained to a loss in the tests learns on its budget, here on the CPU.

    The budget tests/test_gpu.py trains these stages with on CUDA: a GPU takes the same steps, so a budget too small to
    learn on shows here first. The loader runs in this process (num_workers 0: its worker processes, which start at
    every evaluation, take minutes on 2 busy cores and change nothing that is learnt). Slow: fast_5 compiles."""
    m = time_to_loss.run(learning_budget(stage, char_data, "cpu", num_workers=0), label=stage)["metrics"]
    assert m["steps"] >= LEARNING_STEPS
    assert m["val_loss_final"] < 0.8 * m["val_loss_initial"]


# ---- the schedule ------------------------------------------------------------------------------------------


def test_schedule_warms_up_linearly_then_decays_to_its_floor():
    cfg = optimizations.validate(TrainConfig(lr=1e-3, min_lr=1e-4, lr_warmup_tokens=1000, lr_decay_tokens=11000))
    assert learning_rate(cfg, 0) == 0.0
    assert learning_rate(cfg, 500) == pytest.approx(5e-4)  # half way up
    assert learning_rate(cfg, 1000) == pytest.approx(1e-3)  # the peak
    assert learning_rate(cfg, 6000) == pytest.approx((1e-3 + 1e-4) / 2)  # half way down the cosine
    assert learning_rate(cfg, 11000) == pytest.approx(1e-4) == learning_rate(cfg, 50000)  # the floor, and after
    assert all(learning_rate(cfg, t) >= learning_rate(cfg, t + 100) for t in range(1000, 12000, 100))
    constant = optimizations.validate(TrainConfig(lr=1e-3))  # the timed protocol's setting: no schedule
    assert learning_rate(constant, 0) == learning_rate(constant, 10**9) == 1e-3


def test_the_timed_protocol_leaves_the_learning_rate_alone(char_data):
    """lr_decay_tokens 0 (every timed profile): the optimizer's learning rate is never touched."""
    cfg = tiny_config(char_data, warmup_iters=0)
    trainer = train.prepare(cfg, torch.device("cpu"), 3, "test")
    trainer.run(3)
    assert [g["lr"] for g in trainer.optimizer.param_groups] == [cfg.lr, cfg.lr]


# ---- the held-out windows and evaluation ------------------------------------------------------------------


def test_validation_windows_are_the_same_for_every_stage_and_run(char_data):
    torch.manual_seed(1)
    before = torch.get_rng_state()
    a = ValidationSet(char_data, 32, 16)
    assert torch.equal(torch.get_rng_state(), before)  # drawing them touches no training randomness
    torch.manual_seed(2)
    b = ValidationSet(char_data, 32, 16)
    assert torch.equal(a.starts, b.starts) and len(a.starts.unique()) > 1
    baseline, last = smoke_to_a_loss(char_data), smoke_to_a_loss(char_data, "fast_6_chunked_loss")
    assert (baseline.block_size, baseline.eval_windows) == (last.block_size, last.eval_windows)
    assert torch.equal(a.share(0, 2), a.starts[:8]) and torch.equal(a.share(1, 2), a.starts[8:])


def test_evaluation_leaves_the_trajectory_bit_identical(char_data, monkeypatch):
    """Evaluation leaves the training trajectory bit-identical.

    Evaluating after every step or only at the end: the same parameters after training, dropout on (a draw from the
    training RNG by the evaluation would move every later mask)."""
    trainers = []
    real = train.prepare
    monkeypatch.setattr(train, "prepare", lambda *a, **k: trainers.append(real(*a, **k)) or trainers[-1])
    cfg = smoke_to_a_loss(char_data, dropout=0.1, train_tokens=2048, lr_decay_tokens=2048)
    every_step = time_to_loss.run(TrainConfig.from_dict({**cfg.to_dict(), "eval_every_tokens": cfg.tokens_per_step}))
    at_the_end = time_to_loss.run(TrainConfig.from_dict({**cfg.to_dict(), "eval_every_tokens": cfg.train_tokens}))
    assert every_step["metrics"]["evaluations"] == 2048 // cfg.tokens_per_step + 1
    assert at_the_end["metrics"]["evaluations"] == 2
    for p, q in zip(trainers[0].gpt.parameters(), trainers[1].gpt.parameters()):
        assert torch.equal(p, q)
    assert every_step["metrics"]["val_loss_final"] == at_the_end["metrics"]["val_loss_final"]


def test_a_run_that_stops_at_its_target_is_the_full_runs_curve_up_to_the_crossing(char_data):
    """A run that stops at its target is the full run's curve up to the crossing.

    stop_at_target (the speedrun's stages) ends the run at the first evaluation at or below the target: the same
    evaluations up to there as the whole budget's run (values, tokens), the same crossing, and no step more."""
    cfg = smoke_to_a_loss(char_data, train_tokens=4096, lr_decay_tokens=4096, eval_every_tokens=512)
    full = time_to_loss.run(cfg)["metrics"]
    target = full["curve"][3]["val_loss"] + 1e-6  # reached at the third evaluation after the start
    assert all(p["val_loss"] > target for p in full["curve"][:3])
    runs = {
        stop: time_to_loss.run(TrainConfig.from_dict({**cfg.to_dict(), "target_loss": target, "stop_at_target": stop}))[
            "metrics"
        ]
        for stop in (False, True)
    }
    stopped, whole = runs[True], runs[False]
    assert stopped["stopped_at_target"] and not whole["stopped_at_target"]
    assert [p["val_loss"] for p in stopped["curve"]] == [p["val_loss"] for p in whole["curve"][:4]]
    assert stopped["tokens"] == whole["curve"][3]["tokens"] == stopped["steps"] * cfg.tokens_per_step
    assert whole["steps"] == 4096 // cfg.tokens_per_step > stopped["steps"]
    assert stopped["target"]["tokens"] == whole["target"]["tokens"]


# ---- cheaper evaluations toward the target ---------------------------------------------------------------------

WINDOWS = 200  # the cpu profile's validation windows


def constructed_losses(shift: float, steps: int = 60) -> torch.Tensor:
    """Per-window losses at each step (rows): a curve falling ever more slowly, 2 + 2 r exp(-t/10).

    Each window has its own offset (spread 0.3) and its own rate r (spread 0.1: a window's change varies, so the
    estimate's windows do not fall exactly as the rest), plus a little noise per evaluation; the estimate's windows (the
    first quarter) sit `shift` above the rest (below where negative), so the estimate alone would reach the target late
    (or early)."""
    g = torch.Generator().manual_seed(7)
    offsets = 0.3 * torch.randn(WINDOWS, generator=g, dtype=torch.float64)
    rates = 1 + 0.1 * torch.randn(WINDOWS, generator=g, dtype=torch.float64)
    quarter, rest = offsets[: WINDOWS // 4], offsets[WINDOWS // 4 :]
    quarter += shift - quarter.mean()  # the estimate reads `shift` off the full windows' loss (the noise's aside)
    rest -= shift / 3 + rest.mean()
    fall = 2 * torch.exp(-torch.arange(steps + 1, dtype=torch.float64) / 10)
    return (
        2 + fall[:, None] * rates + offsets + 0.01 * torch.randn(steps + 1, WINDOWS, generator=g, dtype=torch.float64)
    )


def declared_on(losses: torch.Tensor, target: float, monkeypatch) -> tuple[int | None, list[dict]]:
    """The evaluation at which a run stopping at `target` declares it reached, and its curve.

    Found through time_to_loss's own choice of windows (evaluation_of), stopping rule (at_target) and loop
    (train_and_evaluate), on `losses` instead of a model."""
    steps = len(losses) - 1
    trainer = SimpleNamespace(
        steps_done=0, cfg=SimpleNamespace(micro_batch_size=10), gpt=None, choices=SimpleNamespace(amp=None), device=None
    )
    trainer.rank = 0

    def sums(raw, val, batch, amp, device, rank, world, part, reference):
        w = losses[trainer.steps_done][part]
        change = w - reference if reference is not None else torch.zeros_like(w)
        return WindowSums(
            float(w.sum()),
            float(len(w)),
            len(w),
            float(w.square().sum()),
            float(change.sum()),
            float(change.square().sum()),
            w,
        )

    monkeypatch.setattr(time_to_loss, "window_sums", sums)
    val = SimpleNamespace(share=lambda rank, world: torch.arange(WINDOWS))
    cfg = SimpleNamespace(stop_at_target=True, target_loss=target, world_size=1, eval_near_target_only=False)
    curve = []

    evaluation = time_to_loss.evaluation_of(trainer, val, cfg)

    def evaluate() -> bool:
        s = evaluation(trainer.steps_done in (0, steps), lambda: None)
        curve.append({"step": trainer.steps_done, "val_loss": s.mean, "estimate": s.windows < WINDOWS})
        return time_to_loss.at_target(cfg, curve)

    def advance(n):
        trainer.steps_done += n

    time_to_loss.train_and_evaluate(steps, 1, lambda: trainer.steps_done, advance, evaluate)
    reached = time_to_loss.at_target(cfg, curve)
    return (curve[-1]["step"] if reached else None), curve


@pytest.mark.parametrize("shift", [-0.06, 0.0, 0.06])
def test_the_target_is_declared_at_the_same_evaluation_as_with_every_window_every_time(shift, monkeypatch):
    """The target is declared at the same evaluation as by a run that reads every window every time.

    On a constructed case whose estimate's windows read up to ~1.6 standard errors above or below the rest: for every
    target along the curve, the run declares the target reached at the first evaluation whose full windows are at or
    below it, as a run reading every window every time does; never on an estimate (no estimate is at or below the
    target); and with estimates while the loss is far above, the saving. Fails with no margin (the estimate above the
    target while the full windows reach it: declared late), where an estimate may declare the target (declared early),
    and where the prediction adds the offset with the wrong sign."""
    losses = constructed_losses(shift)
    full = losses.mean(1)
    moved, on_estimates, estimates = [], [], 0
    for target in torch.linspace(float(full.min()) + 1e-3, float(full[1]), 150).tolist():
        every_window = next((t for t, loss in enumerate(full.tolist()) if loss <= target), None)
        declared, curve = declared_on(losses, target, monkeypatch)
        if declared != every_window:
            moved.append((target, every_window, declared))
        on_estimates += [target for p in curve if p["estimate"] and p["val_loss"] <= target]
        estimates += sum(p["estimate"] for p in curve)
    assert moved == []
    assert on_estimates == []
    assert estimates > 0


def test_pairing_the_estimate_with_the_last_full_evaluation_reads_fewer_windows(monkeypatch):
    """Pairing the estimate with the last full evaluation reads fewer windows.

    The prediction's error is the spread of the windows' changes, not of their losses: on the constructed case, with
    targets along the curve's second half (where the unpaired rule reads every window), it reads fewer windows than the
    estimate's own loss and spread would. Fails where the offset is dropped (near_target unpaired)."""
    losses = constructed_losses(0.0)
    full = losses.mean(1)

    def full_evaluations() -> int:
        targets = torch.linspace(float(full.min()) + 1e-3, float(full[len(full) // 2]), 20).tolist()
        return sum(not p["estimate"] for t in targets for p in declared_on(losses, t, monkeypatch)[1])

    paired = full_evaluations()
    unpaired_rule = evaluation.near_target
    monkeypatch.setattr(
        evaluation,
        "near_target",
        lambda estimate, population, target, previous, offset: unpaired_rule(estimate, population, target, previous),
    )
    unpaired = full_evaluations()
    assert paired < unpaired / 2


def test_an_estimate_needs_enough_windows_and_leaves_the_full_evaluation_s_batches():
    assert estimate_windows(200, 48, 1) == 48  # a quarter, 50, in whole batches of 48: one
    assert estimate_windows(200, 10, 1) == 50
    assert estimate_windows(32, 2, 1) is None  # 8 windows: too few for a standard error
    assert estimate_windows(60, 5, 2) == 15  # 30 windows in all across two processes: enough
    assert estimate_windows(40, 5, 2) is None  # 20: too few
    assert estimate_windows(200, 200, 1) is None  # one batch holds them all: nothing to save
    assert estimate_windows(200, 16, 1) == 48  # 50 is 3.1 batches of 16: three


def test_window_sums_are_the_cross_entropy_of_every_window_and_their_spread():
    """The window sums give every window's cross-entropy and their spread, both from one cross-entropy per token.

    The reference is computed in float64 from the same float32 logits; the only difference allowed is float32 rounding
    of each token's loss (a relative 1e-7 on losses near log 65 ~ 4, kept through float64 sums), so 1e-6 relative bounds
    it with a margin, and a missed or doubled window is 1/12 off."""
    torch.manual_seed(0)
    windows, block, vocab = 12, 8, 65
    x_all = torch.randint(vocab, (windows, block))
    y_all = torch.randint(vocab, (windows, block))
    head = torch.nn.Embedding(vocab, vocab)
    model = lambda x: (head(x), None)  # noqa: E731  (a GPT's call: logits, loss)
    model.eval, model.train, model.training = (lambda: None), (lambda mode=True: None), False
    val = SimpleNamespace(
        share=lambda rank, world: torch.arange(windows), batch=lambda starts, device: (x_all[starts], y_all[starts])
    )
    amp = SimpleNamespace(autocast=contextlib.nullcontext)
    sums = window_sums(model, val, 5, amp, torch.device("cpu"))  # batches of 5, 5, 2
    per_token = torch.nn.functional.cross_entropy(
        head(x_all).double().transpose(1, 2), y_all, reduction="none"
    ).detach()
    assert (sums.tokens, sums.windows) == (windows * block, windows)
    assert sums.loss == pytest.approx(per_token.sum().item(), rel=1e-6)
    assert sums.square == pytest.approx(per_token.mean(1).square().sum().item(), rel=1e-6)
    assert sums.mean == pytest.approx(per_token.mean().item(), rel=1e-6)


def _paired_sums(rank: int, world: int) -> WindowSums:
    """This process's share of twelve windows' paired sums, read by a stand-in model against an earlier one.

    The stand-in model is an embedding's logits; the windows are read against their losses under the earlier one, as a
    run's estimate reads them against its last full evaluation."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(65, (12, 8), generator=g), torch.randint(65, (12, 8), generator=g)
    val = ValidationSet.__new__(ValidationSet)  # the real share and batch, over these windows
    val.starts, val.windows = torch.arange(12), list(zip(x, y))
    amp = SimpleNamespace(autocast=contextlib.nullcontext)

    then, now = (_EmbeddingModel(seed) for seed in (1, 2))
    reference = window_sums(then, val, 5, amp, torch.device("cpu"), rank, world).losses
    return window_sums(now, val, 5, amp, torch.device("cpu"), rank, world, reference=reference)


class _EmbeddingModel(torch.nn.Module):
    """A GPT's call (logits, loss) from one embedding: logits that differ with its seed."""

    def __init__(self, seed: int):
        super().__init__()
        self.head = torch.nn.Embedding(65, 65)
        self.head.weight.data = torch.randn(65, 65, generator=torch.Generator().manual_seed(seed))

    def forward(self, x):
        return self.head(x), None


def _paired_sums_on_a_rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    try:
        sums = _paired_sums(rank, world)
        if rank == 0:
            torch.save(astuple(sums)[:6], out)
    finally:
        dist.destroy_process_group()


def test_paired_sums_on_two_processes_are_one_process_s(tmp_path):
    """Paired sums on two processes are one process's.

    Under DDP or FSDP each process pairs its own windows with its own reference, and the six sums (losses, targets,
    windows, squares, changes, their squares) are all-reduced: two gloo processes give what one process reading every
    window gives, up to float64 rounding in another order (1e-12). Fails where the changes are left out of the
    all-reduce."""
    out = tmp_path / "sums.pt"
    mp.start_processes(_paired_sums_on_a_rank, args=(2, free_port(), str(out)), nprocs=2, start_method="spawn")
    one = astuple(_paired_sums(0, 1))[:6]
    assert one[2] == 12 and one[4] != 0  # every window, and the two models differ: there are changes to sum
    assert torch.load(out) == pytest.approx(one, rel=1e-12)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_recording_the_cuda_graphs_is_start_up_not_training(cuda_graphs, char_data, monkeypatch):
    """Recording the CUDA graphs is start-up, not training, as is the first step's compilation.

    The first step compiles; with CUDA graphs (torch.compile's "reduce-overhead") the second records them and the third
    is their first replay: all three are start-up, each timed on its own, not training seconds. On a clock of the steps'
    own making (10 s, 5 s, 3 s, then 1 s each, the evaluations taking none): without CUDA graphs only the first step is
    start-up (the steady step the mean of the other five, 2.2 s); with them the first three are, and every later step is
    1 s of training."""
    monkeypatch.setattr(RunChoices, "cuda_graphs", property(lambda self: cuda_graphs))
    now = [0.0]
    monkeypatch.setattr(time_to_loss, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    step = train.Trainer.step

    def timed_step(self, feed=None):
        now[0] += {0: 10.0, 1: 5.0, 2: 3.0}.get(self.steps_done, 1.0)
        return step(self, feed)

    monkeypatch.setattr(train.Trainer, "step", timed_step)
    cfg = smoke_to_a_loss(char_data)
    per_step = cfg.tokens_per_step
    m = time_to_loss.run(
        TrainConfig.from_dict(
            {
                **cfg.to_dict(),
                "train_tokens": 6 * per_step,
                "lr_warmup_tokens": per_step,
                "lr_decay_tokens": 6 * per_step,
                "eval_every_tokens": per_step,
            }
        )
    )["metrics"]
    assert m["first_step_s"] == 10.0
    if cuda_graphs:
        assert (m["startup_s"], m["train_seconds"]) == pytest.approx((9.0 + 4.0 + 2.0, 6.0))
        assert [p["seconds"] for p in m["curve"]] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    else:
        assert (m["startup_s"], m["train_seconds"]) == pytest.approx((10.0 - 2.2, 6 * 2.2))
        assert [p["seconds"] for p in m["curve"]] == pytest.approx([0.0, 2.2, 7.2, 10.2, 11.2, 12.2, 13.2])


def test_the_speedrun_stages_stop_at_the_target_unless_told_to_train_the_whole_budget(char_data):
    assert stage_config("speedrun_1_systems", "smoke").stop_at_target
    assert not smoke_to_a_loss(char_data).stop_at_target  # speed_0: its final loss is the speedrun's target
    overrides = to_a_loss_overrides(
        parse_args("speedrun_1_systems", ["--full-budget"]), profile_settings("smoke", "time_to_loss")
    )
    assert not stage_config("speedrun_1_systems", "smoke", **overrides).stop_at_target


# ---- reading a curve ---------------------------------------------------------------------------------------


def curve(*points, rate=50.0):
    """Evaluations every 10 steps of 10 tokens, at `rate` tokens per second."""
    return [{"step": 10 * i, "tokens": 100 * i, "seconds": 100 * i / rate, "val_loss": v} for i, v in enumerate(points)]


def test_time_to_target_is_interpolated_between_the_evaluations_around_it():
    c = curve(4.0, 3.0, 2.0, 1.5)
    hit = crossing(c, 2.5)  # half way between the evaluations at 100 and 200 tokens
    assert (hit["tokens"], hit["seconds"], hit["first_evaluation_step"]) == (150, 3.0, 20)
    assert crossing(c, 2.0)["tokens"] == 200  # exactly at an evaluation
    assert crossing(c, 1.0) is None  # never reached
    assert crossing(c, 5.0)["tokens"] == 0  # reached before training
    assert crossing(curve(4.0, 2.0, 3.0), 2.5)["tokens"] == 75  # the first crossing counts
    assert val_loss_at(c, 250) == pytest.approx(1.75)
    with pytest.raises(ValueError):
        val_loss_at(c, 400)
    assert target_from({"metrics": {"curve": curve(4.0, 3.0, 2.0, 1.5, 1.0, 0.5)}}) == pytest.approx(1.0)


def test_the_crossing_weights_seconds_and_tokens_by_the_loss_fraction():
    """The crossing weights both seconds and tokens by the loss fraction from the evaluation before.

    A quarter of the way from the evaluation before (tokens 100, 1 s, loss 3.0) to the one at the crossing (tokens 200,
    5 s, loss 2.0): seconds not proportional to tokens (a slow stretch), so seconds and tokens each need the weight f =
    (3.0 - 2.75) / (3.0 - 2.0) = 1/4 from the evaluation before (1 - f would give 175, 4 s)."""
    c = [
        {"step": 10 * i, "tokens": 100 * i, "seconds": s, "val_loss": v}
        for i, (s, v) in enumerate([(0.0, 4.0), (1.0, 3.0), (5.0, 2.0)])
    ]
    hit = crossing(c, 2.75)
    assert (hit["tokens"], hit["seconds"], hit["first_evaluation_step"]) == (125, 2.0, 20)


def test_the_target_is_interpolated_where_80_percent_falls_between_evaluations():
    """The target is interpolated where 80% of the budget falls between evaluations.

    Four intervals of 100 tokens: 80% of 400 is 320 tokens, a fifth of the way from the evaluation at 300 (loss 2.0) to
    the one at 400 (loss 1.5): 1.9, which no evaluation holds."""
    assert target_from({"metrics": {"curve": curve(4.0, 3.0, 2.5, 2.0, 1.5)}}) == pytest.approx(1.9)


def test_seed_spread_is_the_range_in_any_order():
    assert seed_spread([1.90, 1.95, 1.92]) == pytest.approx(0.05)
    assert seed_spread([1.95, 1.90, 1.92]) == pytest.approx(0.05)  # the first seed is not the lowest
    assert seed_spread([1.92, 1.95, 1.90]) == pytest.approx(0.05)
    assert seed_spread([1.9]) == 0.0  # one seed: no spread measured


@pytest.mark.parametrize(
    "final, changed",
    [
        (2.5, True),
        (1.5, True),  # beyond the spread, worse and better: a better loss is another trajectory too
        (2.25, False),
        (1.75, False),  # exactly the spread away (binary fractions, no rounding): not beyond it
        (2.125, False),
        (2.0, False),
    ],
)
def test_changes_convergence_beyond_the_seed_spread_either_way(final, changed):
    assert changes_convergence(final, 2.0, spread=0.25) == changed


# ---- real runs on the smoke profile ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_runs(char_data):
    """The baseline with 3 seeds and stages that keep or break the mathematics, trained to the smoke budget.

    The stage that keeps it: speed_3's DataLoader workers and pinned memory, at the baseline's batch; the one that
    breaks it: the learning rate x100."""
    base = smoke_to_a_loss(char_data)
    runs = {"speed_0_baseline": time_to_loss.run(base)}
    target = target_from(runs["speed_0_baseline"])
    runs["seeds"] = [time_to_loss.run(smoke_to_a_loss(char_data, seed=base.seed + i)) for i in (1, 2)]
    runs["same maths"] = time_to_loss.run(
        smoke_to_a_loss(char_data, "speed_3_non_blocking", batch_size=base.batch_size, target_loss=target)
    )
    runs["lr x100"] = time_to_loss.run(smoke_to_a_loss(char_data, lr=base.lr * 100, min_lr=base.min_lr * 100))
    return runs


def test_a_smoke_run_learns(smoke_runs):
    m = smoke_runs["speed_0_baseline"]["metrics"]
    assert m["val_loss_final"] < 0.8 * m["val_loss_initial"]  # ~4.4 (uniform over 65 characters) -> ~3.2
    assert [p["tokens"] for p in m["curve"]] == sorted({p["tokens"] for p in m["curve"]})
    assert m["curve"][0]["step"] == 0 and m["curve"][-1]["tokens"] == m["tokens"] > 0
    assert all(p["seconds"] <= q["seconds"] for p, q in zip(m["curve"], m["curve"][1:]))
    assert m["tokens_per_s"] > 0 and m["eval_seconds"] > 0 and m["train_loss_final"] is not None
    record = {
        **smoke_runs["speed_0_baseline"],
        "stage": "speed_0_baseline",
        "ladder": "speed",
        "profile": "smoke",
        "parent": None,
        "mode": "time_to_loss",
    }
    assert record_problems(record) == []


def test_the_mark_fires_on_a_broken_stage_and_not_on_one_that_keeps_the_maths(smoke_runs):
    finals = [r["metrics"]["val_loss_final"] for r in [smoke_runs["speed_0_baseline"], *smoke_runs["seeds"]]]
    spread, base = seed_spread(finals), finals[0]
    assert spread > 0  # different seeds: different models
    # The threshold is the seeds' own spread: no seed changes convergence against another (the farthest two are
    # exactly the spread apart), so a smaller threshold would mark the baseline's own seeds.
    assert not any(changes_convergence(a, b, spread) for a in finals for b in finals)
    assert not changes_convergence(smoke_runs["same maths"]["metrics"]["val_loss_final"], base, spread)
    assert smoke_runs["same maths"]["metrics"]["val_loss_final"] == base  # identical training on a CPU
    assert changes_convergence(smoke_runs["lr x100"]["metrics"]["val_loss_final"], base, spread)
    target = smoke_runs["same maths"]["metrics"]["target"]
    assert (
        target["tokens"]
        == crossing(smoke_runs["speed_0_baseline"]["metrics"]["curve"], target_from(smoke_runs["speed_0_baseline"]))[
            "tokens"
        ]
    )


def test_the_report_reads_the_runs(smoke_runs, tmp_path):
    """The section from real records: the target, the seeds' spread, the mark on the broken run, the ladder's plot.

    The broken run stands in speed_1's place; the plot is the speed ladder's."""
    folder = tmp_path / "time_to_loss"
    folder.mkdir()
    for name, stage in (("speed_0_baseline", "speed_0_baseline"), ("lr x100", "speed_1_batch_size")):
        (folder / f"{stage}.json").write_text(json.dumps({**smoke_runs[name], "stage": stage, "status": "ok"}))
    for r in smoke_runs["seeds"]:
        (folder / f"speed_0_baseline.seed{r['config']['seed']}.json").write_text(
            json.dumps({**r, "stage": "speed_0_baseline", "status": "ok"})
        )
    runs = LossRuns(tmp_path)
    assert runs.target == pytest.approx(target_from(smoke_runs["speed_0_baseline"]))
    assert len(runs.seeds) == 2 and runs.spread > 0
    text = "\n".join(loss_section(runs, tmp_path, "plots"))
    assert "**changes convergence**" in text
    assert (tmp_path / "time_to_loss_speed.png").exists()  # one figure per ladder trained to a loss
    assert not (tmp_path / "time_to_loss_fast.png").exists()  # no fast stage was trained: no empty figure


def write_loss_records(tmp_path, *records):
    """(stage, tokens/s, optimizer steps, validation losses at equal intervals, name suffix) as LossRuns reads them."""
    folder = tmp_path / "time_to_loss"
    folder.mkdir()
    for stage, rate, steps, points, *suffix in records:
        r = {
            "stage": stage,
            "status": "ok",
            "config": {},
            "metrics": {
                "tokens_per_s": rate,
                "steps": steps,
                "val_loss_final": points[-1],
                "curve": curve(*points, rate=rate),
                "startup_s": 0.0,
            },
        }
        (folder / f"{stage}{''.join(suffix)}.json").write_text(json.dumps(r))
    return LossRuns(tmp_path)


def test_the_summary_says_in_one_sentence_why_per_sample_gains_do_not_reach_the_target(tmp_path):
    """The summary says in one sentence why per-sample gains do not reach the target.

    No stage reaches the baseline's target sooner: the sentence names the stage that changed the model and how much
    sooner a later stage reaches that model's loss; it stands in the summary, once."""
    from gpt.report.summary import loss_sentence

    runs = write_loss_records(
        tmp_path,
        ("speed_0_baseline", 100.0, 80, (4.0, 3.0, 2.5, 2.2, 2.0)),
        ("speed_0_baseline", 100.0, 80, (4.0, 3.0, 2.5, 2.2, 2.01), ".seed1"),
        ("speed_1_batch_size", 200.0, 10, (4.0, 3.5, 3.2, 3.0, 2.9)),
        ("speed_2_num_workers", 400.0, 10, (4.0, 3.5, 3.2, 3.0, 2.9)),
    )
    sentence = loss_sentence(runs)
    assert sentence.startswith(
        "no stage reaches `speed_0_baseline`'s target loss (2.160) sooner "
        "than it does (3.20 s): `speed_1_batch_size` trains another model"
    )
    assert (
        "the last of those, `speed_2_num_workers`, reaches that model's loss 2.00x as fast as `speed_1_batch_size`"
        in sentence
    )


def test_the_summary_has_no_time_to_loss_finding_where_only_the_baseline_trained_to_a_loss(tmp_path):
    """Where only the baseline trained to a loss (a speedrun-only run: its seeds set the target), nothing is compared.

    The summary then says nothing of the time to loss; it said "no stage reaches ... sooner than it does", true of no
    stage at all (records/cpu-epyc-avx2-2026-12-01's page, before)."""
    from gpt.report.summary import loss_sentence

    runs = write_loss_records(
        tmp_path,
        ("speed_0_baseline", 100.0, 80, (4.0, 3.0, 2.5, 2.2, 2.0)),
        ("speed_0_baseline", 100.0, 80, (4.0, 3.0, 2.5, 2.2, 2.01), ".seed1"),
    )
    assert runs.to_target("speed_0_baseline") and loss_sentence(runs) is None


def test_a_stage_with_no_effect_only_when_trained_to_a_loss_says_why_beside_its_timed_gain(tmp_path):
    """A stage with no effect only when trained to a loss says why, beside its timed gain.

    fast_6's chunked loss: a gain in the timed ladder (large vocabulary), no effect at the time-to-loss shape (65
    characters): the section says so with both models' shapes; a stage with no effect in both gets no line."""
    from gpt.report.time_to_loss import no_effect_findings

    runs = write_loss_records(
        tmp_path, ("fast_6_chunked_loss", 100.0, 10, (4.0, 3.0)), ("fast_2_bf16", 100.0, 10, (4.0, 3.0))
    )
    small = {"n_layer": 4, "n_embd": 128, "vocab_size": 65, "block_size": 64}
    for stage in ("fast_6_chunked_loss", "fast_2_bf16"):
        runs.records[stage].update(no_effect="no effect on cpu: the logits are small", model=small)
    timed = {
        "fast_6_chunked_loss": {"status": "ok", "no_effect": None, "model": {**small, "vocab_size": 50304}},
        "fast_2_bf16": {"status": "ok", "no_effect": "no effect on cpu: bf16", "model": small},
    }
    assert no_effect_findings(runs, timed) == [
        "`fast_6_chunked_loss` is marked (no effect) here but not in the fast ladder's table above: no effect on cpu: "
        "the logits are small. The model trained here has 4 layers x 128, vocabulary 65, block 64; the timed "
        "ladder's has 4 x 128, vocabulary 50304, block 64."
    ]


def test_a_finding_when_the_gain_per_sample_does_not_carry_over(tmp_path):
    """A stage 8x fewer steps per token, twice the rate, never at its parent's loss: one line, from the curves."""
    runs = write_loss_records(
        tmp_path,
        ("speed_0_baseline", 100.0, 80, (4.0, 3.0, 2.5, 2.2, 2.0)),
        ("speed_1_batch_size", 200.0, 10, (4.0, 3.5, 3.2, 3.0, 2.9)),
    )
    (line,) = loss_findings(runs)
    assert line.startswith(
        "`speed_1_batch_size` trains +100% faster per sample than `speed_0_baseline` but does "
        "not reach its parent's loss within the budget: 10 optimizer steps for the budget against "
        "80 (8x fewer per token)"
    )


def test_a_finding_for_a_changed_convergence_without_a_gain_per_sample(tmp_path):
    """A changed convergence without a gain per sample gets a finding that says why.

    DDP at the same rate with half the steps per token ends beyond the seeds' spread: a line says why; a stage at its
    parent's rate and loss (speed_5 after a same-loss speed_4) gets none."""
    base = (4.0, 3.0, 2.5, 2.2, 2.0)
    runs = write_loss_records(
        tmp_path,
        ("speed_0_baseline", 100.0, 80, base),
        ("speed_0_baseline", 100.0, 80, base[:-1] + (2.01,), ".seed1"),
        ("speed_4_compile", 300.0, 10, (4.0, 3.5, 3.2, 3.0, 2.9)),
        ("speed_5_amp", 300.0, 10, (4.0, 3.5, 3.2, 3.0, 2.9)),
        ("speed_6_ddp", 298.0, 5, (4.0, 3.8, 3.5, 3.3, 3.2)),
    )
    (line,) = [f for f in loss_findings(runs) if "speed_6" in f or "speed_5" in f]
    assert line == (
        "`speed_6_ddp` (-0.7% tokens/s against `speed_5_amp`) does not reach its parent's loss within the "
        "budget: 5 optimizer steps for the budget against 10 (2x fewer per token); its final validation "
        "loss is 3.200 against 2.900, beyond the seeds' spread of 0.010."
    )


def test_stages_after_a_changed_model_are_timed_to_that_model(tmp_path):
    """Stages after a changed model are timed to that model's loss.

    After speed_1's batch x8 (marked) no stage reaches the baseline's target, but the stages that keep speed_1's model
    are timed to its loss at 80% of the budget: a column and one finding (the last fast stage against speed_1 and
    against speed_5_amp, where the fast ladder starts, and the baseline, whose curve passes that loss too); speed_6,
    which changes the model again, keeps none."""
    base, batch96 = (4.0, 3.0, 2.5, 2.2, 2.0, 1.9), (4.0, 3.5, 3.2, 3.0, 2.9, 2.8)
    records = [
        ("speed_0_baseline", 100.0, 80, base),
        ("speed_0_baseline", 100.0, 80, base[:-1] + (1.91,), ".seed1"),
        ("speed_1_batch_size", 125.0, 10, batch96),
        ("speed_5_amp", 250.0, 10, batch96),
        ("speed_6_ddp", 300.0, 5, (4.0, 3.8, 3.5, 3.3, 3.2, 3.1)),
        ("fast_6_chunked_loss", 375.0, 10, batch96),
    ]
    runs = write_loss_records(tmp_path, *records)
    assert [
        runs.kept_model(s) for s in ("speed_0_baseline", "speed_1_batch_size", "speed_5_amp", "fast_6_chunked_loss")
    ] == [None, None, "speed_1_batch_size", "speed_1_batch_size"]
    # speed_1's loss at 80% of its 500 tokens (400: 2.9) after 400 / 125 = 3.2 s; fast_6 at 375 tokens/s: 3x sooner
    assert runs.loss_of("speed_1_batch_size") == pytest.approx(2.9)
    assert runs.vs("fast_6_chunked_loss", "speed_1_batch_size") == pytest.approx((3.2, 400 / 375))
    rows = {cells[0]: cells for line in loss_table(runs)[2:] if (cells := [c.strip() for c in line.split("|")[1:-1]])}
    assert rows["fast_6_chunked_loss"][6] == "3.00x vs `speed_1`" and rows["speed_5_amp"][6] == "2.00x vs `speed_1`"
    assert rows["speed_6_ddp"][6] == rows["speed_1_batch_size"][6] == rows["speed_0_baseline"][6] == ""
    (line,) = kept_model_findings(runs)
    assert line == (
        "`speed_1_batch_size` trains another model than its parent (marked changes convergence), and the 2 "
        "stages after it keep that model: each is also timed to `speed_1_batch_size`'s loss at 80% of its "
        "budget, 2.900, which `speed_1_batch_size` reaches in 3.20 s; it is reached by "
        "`fast_6_chunked_loss` in 1.07 s (3.00x as fast) and by `speed_5_amp` in 1.60 s (2.00x as fast); "
        "`speed_0_baseline` reaches it in 1.20 s."
    )
    # the baseline's curve passes 2.9 after 1.2 s (between 3.0 at 1 s and 2.5 at 2 s): with fast_6 no faster than
    # speed_5, the changed model costs time to loss, and the finding says so
    slower = tmp_path / "slower"
    slower.mkdir()
    runs = write_loss_records(slower, *records[:-1], ("fast_6_chunked_loss", 250.0, 10, batch96))
    assert kept_model_findings(runs)[0].endswith(
        "`speed_0_baseline` reaches it in 1.20 s, sooner than every stage that keeps it."
    )


def test_wandb_logs_the_curve_against_tokens(smoke_runs, tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    from test_wandb import read_offline_run

    from gpt import wandb_log

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("GPT_LADDER_GROUP", "test-group")
    record = {
        **smoke_runs["speed_0_baseline"],
        "stage": "speed_0_baseline",
        "ladder": "speed",
        "profile": "smoke",
        "mode": "time_to_loss",
        "seed": 3407,
    }
    wandb_log.log_run(record, mode="offline")
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    records = read_offline_run(run_file)
    (run,) = [r.run for r in records if r.HasField("run")]
    assert (run.job_type, run.run_group, run.display_name) == ("time_to_loss", "test-group", "speed_0_baseline")
    history = [
        {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.HasField("history")
    ]
    points = [h for h in history if "val/loss" in h]
    curve_ = record["metrics"]["curve"]
    assert [h["val/loss"] for h in points] == pytest.approx([p["val_loss"] for p in curve_])
    assert [h["curve/tokens"] for h in points] == [p["tokens"] for p in curve_]
    assert [h["curve/seconds"] for h in points] == pytest.approx([p["seconds"] for p in curve_])


# ---- bad input ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--train-tokens", "0"], "--train-tokens must be a positive number of tokens, got 0"),
        (["--train-tokens", "-5"], "--train-tokens must be a positive number of tokens, got -5"),
        (["--time-to-loss", "--eval-every-tokens", "0"], "--eval-every-tokens must be at least 1, got 0"),
        (["--time-to-loss", "--target-loss", "nan"], "the target loss must be a finite number, got nan"),
        (["--time-to-loss", "--target-loss", "inf"], "the target loss must be a finite number, got inf"),
        (
            ["--time-to-loss", "--target-loss", "-1"],
            "the target loss must be above 0 (a cross-entropy never reaches 0), got -1.0",
        ),
        (["--target-loss", "2.0"], "add --time-to-loss"),
        (["--time-to-loss", "--lr", "0"], "--lr must be a positive number, got 0.0"),
        (["--time-to-loss", "--lr", "nan"], "--lr must be a positive number, got nan"),
        (["--lr", "1e-3"], "add --time-to-loss"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(args, message, char_data, tmp_path, capsys):
    """Through the stage's entry point in this process; the first case also as a user runs the script."""
    out = tmp_path / "out"
    argv = smoke_stage_argv(char_data, out)
    with pytest.raises(SystemExit) as exit_:
        stage_main(str(REPO / "stages" / "speed_0_baseline.py"), [*argv, *args])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and err.startswith("error: ") and "\n" not in err and message in err
    if args == ["--train-tokens", "0"]:  # a fresh process: nothing else on its stderr
        script = str(REPO / "stages" / "speed_0_baseline.py")
        r = subprocess.run([sys.executable, script, *argv, *args], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and r.stderr.strip() == err
    assert not list(out.rglob("*.json"))


def test_a_target_the_untrained_model_already_meets_is_recorded_and_summarised_without_a_step(
    char_data, tmp_path, capsys
):
    """A target at or above the untrained loss: reached before training, the run stops, and the summary says so.

    Seen failing before the summary knew a run of no step: a TypeError formatting the missing train loss, after the
    record was written."""
    stage = stages_of("speedrun")[-1]
    with pytest.raises(SystemExit) as exit_:
        stage_main(str(REPO / "stages" / f"{stage}.py"), [*smoke_stage_argv(char_data, tmp_path), "--target-loss", "9"])
    assert exit_.value.code == 0
    record = json.loads(next(tmp_path.rglob(f"{stage}.json")).read_text())
    assert record["metrics"]["steps"] == 0 and record["metrics"]["target"]["rule"] == "reached before training"
    out = capsys.readouterr().out
    assert "no training step" in out and "target 9.000: reached after 0 tokens, 0.0 s of training" in out


def test_another_learning_rate_keeps_the_profiles_floor_ratio():
    """--lr 4e-3 on the cpu profile (1e-3 decaying to 1e-4): the floor becomes 4e-4; without it, the profile's."""
    profile = profile_settings("cpu", "time_to_loss")
    ask = to_a_loss_overrides(parse_args("speed_1_batch_size", ["--time-to-loss", "--lr", "4e-3"]), profile)
    assert (ask["lr"], ask["min_lr"]) == pytest.approx((4e-3, 4e-4))
    assert "lr" not in to_a_loss_overrides(parse_args("speed_1_batch_size", ["--time-to-loss"]), profile)


def test_a_data_set_without_a_val_split_is_one_line(char_data, tmp_path):
    data = tmp_path / "no_val"
    shutil.copytree(char_data, data)
    (data / "val.bin").unlink()
    r = subprocess.run(
        [
            sys.executable,
            str(REPO / "stages" / "speed_0_baseline.py"),
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--data-dir",
            str(data),
            "--out",
            str(tmp_path / "out"),
            "--time-to-loss",
            "--wandb",
            "disabled",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "val.bin is missing" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not list((tmp_path / "out").rglob("*.json"))


def test_memory_stages_are_not_trained_to_a_loss(char_data):
    with pytest.raises(UserError, match="keeps its parent's trajectory"):
        stage_config("memory_2_checkpointing", "smoke", True)
    assert math.isclose(smoke_to_a_loss(char_data).lr_decay_tokens, smoke_to_a_loss(char_data).train_tokens)


def test_run_all_trains_the_baseline_seeds_first_then_every_stage_with_its_target(tmp_path, monkeypatch):
    """run_all trains the baseline's seeds first, then every stage with the target from them.

    The fifth section's order: speed_0 with three seeds, the target from its curve, then the other speed and fast stages
    with it; each job's record in <out>/time_to_loss/, each command the stage script's own."""
    from gpt import run_all
    from gpt.ladder import stages_of

    commands = []

    def fake_stage(cmd, log, show, deadline=None):
        commands.append(cmd)
        stage, seed = Path(cmd[1]).stem, (cmd[cmd.index("--seed") + 1] if "--seed" in cmd else None)
        record = {
            "stage": stage,
            "ladder": "speed",
            "profile": "smoke",
            "parent": None,
            "status": "ok",
            "mode": "time_to_loss",
            "config": {},
            "device": {"type": "cpu", "name": "Test CPU", "count": 1},
            "metrics": {
                "curve": curve(4.0, 3.0, 2.5, 2.2, 2.0, 1.9),
                "val_loss_initial": 4.0,
                "val_loss_final": 1.9,
                "tokens": 500,
                "steps": 50,
                "train_seconds": 10.0,
                "tokens_per_s": 50.0,
                "startup_s": 0.0,
            },
        }
        folder = tmp_path / "time_to_loss"
        (folder / (f"{stage}.json" if seed is None else f"{stage}.seed{seed}.json")).write_text(json.dumps(record))
        return 0

    monkeypatch.setattr(run_all, "run_stage", fake_stage)
    monkeypatch.setattr(run_all, "prepare_data", lambda profile, sections: None)
    monkeypatch.setattr(run_all, "calibrate_cpu_peaks", lambda threads, rounds: {"float32 x2 threads": 1e11})
    monkeypatch.setattr(run_all, "matmul_rate", lambda dtype, seconds, rounds: 1e11)
    assert (
        run_all.main(
            [
                "--profile",
                "smoke",
                "--device",
                "cpu",
                "--only",
                "time_to_loss",
                "--out",
                str(tmp_path),
                "--wandb",
                "disabled",
            ]
        )
        == 0
    )
    stages = [Path(c[1]).stem for c in commands]
    others = [s for ladder in ("speed", "fast") for s in stages_of(ladder)][1:]
    assert stages == ["speed_0_baseline"] * 3 + others
    assert [c[c.index("--seed") + 1] for c in commands[1:3]] == ["3408", "3409"] and "--seed" not in commands[0]
    assert all("--time-to-loss" in c for c in commands)
    target = float(commands[3][commands[3].index("--target-loss") + 1])
    assert target == pytest.approx(2.0)  # 80% of 500 tokens: the evaluation at 400 tokens
    assert "## Time to loss" in (tmp_path / "results.md").read_text()


def test_the_process_age_is_read_from_the_os(tmp_path):
    """gpt/clocks.py:process_age_s reads a process's age from the OS.

    A child process that sleeps half a second before asking is at least that old, and not much older; where the OS does
    not say (no /proc), None."""
    from gpt import clocks

    code = "import time; time.sleep(0.5); from gpt.clocks import process_age_s; print(process_age_s())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    ).stdout
    if sys.platform.startswith("linux"):
        assert 0.5 <= float(out) < 60
    assert clocks.process_age_s(proc=tmp_path / "no-proc") is None


def test_a_run_to_a_loss_splits_its_wall_clock(char_data, monkeypatch):
    """The record of a run to a loss gives the process's own split of its wall clock.

    Before the set-up (imports, arguments), the set-up (data, model, run-time measurements, optimizer), the start-up,
    training and evaluations, and the whole, each within the next; and the minor page faults of the steady training
    steps, per step."""
    cfg = smoke_to_a_loss(char_data)
    m = time_to_loss.run(
        TrainConfig.from_dict(
            {**cfg.to_dict(), "train_tokens": 4 * cfg.tokens_per_step, "eval_every_tokens": 2 * cfg.tokens_per_step}
        )
    )["metrics"]
    assert m["setup_s"] > 0
    if sys.platform.startswith("linux"):
        assert 0 < m["import_setup_s"] < m["process_s"]
        inside = m["import_setup_s"] + m["setup_s"] + m["startup_s"] + m["train_seconds"] + m["eval_seconds"]
        assert inside <= m["process_s"] + 0.05
        # over the 3 steady steps (the first is start-up); a count, so a whole number of faults over 3 steps
        assert m["minor_faults_per_step"] >= 0 and (3 * m["minor_faults_per_step"]) % 1 == 0

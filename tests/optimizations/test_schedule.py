"""The learning-rate schedule (gpt/optimizations/schedule.py): wsd's shape, and that Muon's and AdamW's groups both
follow it, each from its own peak, as the curve records. Its bad settings are refused in one line with Muon's
(tests/optimizations/test_muon.py: test_bad_settings_are_one_line_and_exit_2)."""

import pytest
import torch
from conftest import needs_muon
from test_time_to_loss import smoke_to_a_loss

from gpt import optimizations, time_to_loss, train
from gpt.config import TrainConfig
from gpt.optimizations.schedule import learning_rate

# ---- the schedule ------------------------------------------------------------------------------------------


def test_wsd_warms_up_holds_then_decays_linearly_to_its_floor():
    # the decay: the last 2200 tokens, from 8800
    cfg = optimizations.validate(
        TrainConfig(
            lr=1e-3, min_lr=1e-4, lr_warmup_tokens=1000, lr_decay_tokens=11000, lr_schedule="wsd", lr_cooldown=0.2
        )
    )
    assert learning_rate(cfg, 0) == 0.0
    assert learning_rate(cfg, 500) == pytest.approx(5e-4)  # half way up
    assert learning_rate(cfg, 1000) == learning_rate(cfg, 5000) == learning_rate(cfg, 8800) == 1e-3  # stable
    assert learning_rate(cfg, 8800 + 1100) == pytest.approx((1e-3 + 1e-4) / 2)  # half way down, linearly
    assert learning_rate(cfg, 8800 + 550) == pytest.approx(1e-3 - 0.25 * 9e-4)
    assert learning_rate(cfg, 11000) == pytest.approx(1e-4) == learning_rate(cfg, 50000)  # the floor, and after


@needs_muon
def test_the_schedule_scales_muons_and_adamws_groups_from_their_own_peaks(char_data):
    """Trained through the Stepper: after each step every AdamW group is at learning_rate, every Muon group at the
    same share of muon_lr (the stable phase: the peaks themselves; the decay: below them)."""
    budget = 40 * 4 * 32  # 40 steps of the smoke batch; the warm-up is its first 10, the decay its last 20
    cfg = smoke_to_a_loss(
        char_data,
        matrix_optimizer="muon",
        lr_schedule="wsd",
        lr_cooldown=0.5,
        muon_lr=0.03,
        train_tokens=budget,
        lr_decay_tokens=budget,
    )
    trainer = train.prepare(cfg, torch.device("cpu"), 40, "test")
    muon, adamw = trainer.optimizer.muon.param_groups, trainer.optimizer.adamw.param_groups
    shares = []
    for step in (1, 10, 20, 30, 40):  # warm-up, stable, decay
        while trainer.step.steps_done < step:
            trainer.run(1)
        tokens = trainer.step.tokens_seen
        share = learning_rate(cfg, tokens) / cfg.lr
        shares.append(share)
        assert all(g["lr"] == learning_rate(cfg, tokens) for g in adamw), step
        assert all(g["lr"] == pytest.approx(share * cfg.muon_lr, rel=1e-12) for g in muon), step
    assert shares[0] < 1 and 1.0 in shares and shares[-1] < 1


@needs_muon
def test_the_curve_records_adamws_learning_rate_and_muons_beside_it(char_data):
    """A run to a loss with Muon: each point's `lr` is AdamW's (the run's lr setting, as every other stage's curve
    has it), its `muon_lr` Muon's at the same share of muon_lr; before the first step neither exists. AdamW's
    warm-up peak is 1e-3 here and Muon's 0.03: the two cannot be mistaken for each other."""
    budget = 8 * 4 * 32  # 8 steps of the smoke batch, evaluated every 2
    cfg = smoke_to_a_loss(
        char_data,
        matrix_optimizer="muon",
        lr_schedule="wsd",
        lr_cooldown=0.5,
        muon_lr=0.03,
        train_tokens=budget,
        lr_decay_tokens=budget,
        lr_warmup_tokens=budget // 4,
        eval_every_tokens=budget // 4,
    )
    curve = time_to_loss.run(cfg)["metrics"]["curve"]
    for point in curve[1:]:
        share = learning_rate(cfg, point["tokens"]) / cfg.lr
        assert point["lr"] == pytest.approx(share * cfg.lr, rel=1e-12), point
        assert point["muon_lr"] == pytest.approx(share * cfg.muon_lr, rel=1e-12), point
    assert (curve[0]["lr"], curve[0]["muon_lr"]) == (None, None)
    adamw_only = time_to_loss.run(TrainConfig.from_dict({**cfg.to_dict(), "matrix_optimizer": "adamw"}))
    assert all("muon_lr" not in p for p in adamw_only["metrics"]["curve"])

"""The learning-rate schedule (gpt/optimizations/schedule.py): wsd, Muon's own schedule and the speedrun's budget cuts.

wsd's shape, and that Muon's and AdamW's groups both follow it, each from its own peak, as the curve records; Muon's own
schedule (set_learning_rates, muon_momentum; the speedrun's muon_lr_warmup and muon_momentum_warmup_tokens): Muon's
groups at their peak rate from the first step while AdamW's warm up, and Muon's momentum rising linearly from 0.85 to
muon_momentum, then held; the speedrun's budget cuts. Its bad settings are refused in one line with Muon's
(tests/optimizations/test_muon.py: test_bad_settings_are_one_line_and_exit_2) and here. Fast, on the CPU."""

import pytest
import torch
from conftest import needs_muon
from test_muon import built
from test_time_to_loss import smoke_to_a_loss

from gpt import optimizations, time_to_loss, train
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.ladder import stage_config
from gpt.optimizations.schedule import (
    MUON_MOMENTUM_START,
    cooldown_start,
    learning_rate,
    muon_momentum,
    set_learning_rates,
)

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
    """The schedule scales Muon's and AdamW's groups, each from its own peak.

    Trained through Trainer.step: after each step every AdamW group is at learning_rate, every Muon group at the same
    share of muon_lr (the stable phase: the peaks themselves; the decay: below them)."""
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
        while trainer.steps_done < step:
            trainer.run(1)
        tokens = trainer.tokens_seen
        share = learning_rate(cfg, tokens) / cfg.lr
        shares.append(share)
        assert all(g["lr"] == learning_rate(cfg, tokens) for g in adamw), step
        assert all(g["lr"] == pytest.approx(share * cfg.muon_lr, rel=1e-12) for g in muon), step
    assert shares[0] < 1 and 1.0 in shares and shares[-1] < 1


@needs_muon
def test_the_curve_records_adamws_learning_rate_and_muons_beside_it(char_data):
    """The curve records AdamW's learning rate as `lr` and Muon's beside it as `muon_lr`.

    A run to a loss with Muon: each point's `lr` is AdamW's (the run's lr setting, as every other stage's curve has it),
    its `muon_lr` Muon's at the same share of muon_lr; before the first step neither exists. AdamW's warm-up peak is
    1e-3 here and Muon's 0.03: the two cannot be mistaken for each other."""
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


# ---- Muon's own schedule and the speedrun's budgets --------------------------------------------------------

SCHEDULE = dict(lr=1e-3, min_lr=1e-4, lr_warmup_tokens=1000, lr_decay_tokens=10000, lr_schedule="wsd", lr_cooldown=0.5)


def test_the_momentum_rises_linearly_from_085_then_holds():
    cfg = optimizations.validate(
        TrainConfig(matrix_optimizer="muon", muon_momentum=0.95, muon_momentum_warmup_tokens=2000, **SCHEDULE)
    )
    assert MUON_MOMENTUM_START == 0.85
    assert muon_momentum(cfg, 0) == pytest.approx(0.85)
    assert muon_momentum(cfg, 1000) == pytest.approx(0.90)  # half way
    assert muon_momentum(cfg, 2000) == muon_momentum(cfg, 9000) == pytest.approx(0.95)
    off = optimizations.validate(TrainConfig(matrix_optimizer="muon", muon_momentum=0.95, **SCHEDULE))
    assert muon_momentum(off, 0) == 0.95  # off by default: the parent's constant momentum


def test_without_warm_up_only_the_warm_up_changes():
    cfg = optimizations.validate(TrainConfig(**SCHEDULE))
    for tokens in (0, 500, 999):
        assert learning_rate(cfg, tokens, warmup=False) == cfg.lr > learning_rate(cfg, tokens)
    for tokens in (1000, 5000, 7500, 10000, 20000):  # the stable phase and the decay: the same
        assert learning_rate(cfg, tokens, warmup=False) == learning_rate(cfg, tokens)


@needs_muon
@pytest.mark.parametrize("lr_warmup", [True, False])
def test_muons_groups_skip_the_warm_up_and_take_the_momentum_adamws_do_not(char_data, lr_warmup):
    cfg, _, optimizer = built(
        char_data, muon_lr=0.02, muon_lr_warmup=lr_warmup, muon_momentum_warmup_tokens=2000, **SCHEDULE
    )
    for tokens in (100, 1000, 6000, 9000):  # warm-up, stable, decay
        set_learning_rates(optimizer, cfg, tokens)
        rate, unwarmed = learning_rate(cfg, tokens), learning_rate(cfg, tokens, warmup=False)
        for group in optimizer.adamw.param_groups:
            assert group["lr"] == rate and "momentum" not in group
        for group in optimizer.muon.param_groups:
            assert group["lr"] == pytest.approx((rate if lr_warmup else unwarmed) / cfg.lr * 0.02, rel=1e-12)
            assert group["momentum"] == pytest.approx(muon_momentum(cfg, tokens))
    assert optimizer.muon.param_groups[0]["momentum"] == pytest.approx(0.95)


@needs_muon
def test_a_muon_step_uses_the_momentum_set(char_data):
    """A Muon step uses the momentum set in its group.

    torch's Muon reads the group's momentum at each step (its buffer: buf.lerp_(grad, 1 - momentum)): after one step
    from an empty buffer, the buffer is (1 - 0.85) x the gradient, so the momentum set is the one used."""
    cfg, raw, optimizer = built(char_data, muon_momentum_warmup_tokens=2000, **SCHEDULE)
    set_learning_rates(optimizer, cfg, 0)
    p = optimizer.muon.param_groups[0]["params"][0]
    p.grad = torch.ones_like(p)
    optimizer.muon.step()
    buf = optimizer.muon.state[p]["momentum_buffer"]
    assert torch.allclose(buf, torch.full_like(p, 1 - MUON_MOMENTUM_START))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(muon_lr_warmup=False), "need Muon"),
        (dict(matrix_optimizer="muon", muon_momentum_warmup_tokens=-1), "non-negative integer"),
        (dict(matrix_optimizer="muon", muon_momentum=0.8, muon_momentum_warmup_tokens=10), "at least"),
    ],
)
def test_bad_settings_are_refused(overrides, message):
    with pytest.raises(UserError, match=message):
        optimizations.validate(TrainConfig(**overrides))


def test_speedrun_7s_budget_moves_the_decay_to_where_its_parent_reached_the_target():
    """speedrun_7_budget moves the decay to before where its parent reached the target.

    speedrun_7_budget on the cpu profile: 72% of speedrun_6's 384,000 tokens, the schedule ending there, so the decay
    (the same 40%) starts at 165,888 tokens instead of 230,400: before the ~230,000-260,000 tokens where its parent and
    itself reach the target on the tuning seeds (docs/speedrun.md). The warm-up stays a tenth of the budget, the
    evaluations keep their number (40); nothing else changes."""
    parent = stage_config("speedrun_6_bigram", "cpu")
    cfg = stage_config("speedrun_7_budget", "cpu")
    assert parent.train_tokens == 384_000 and cfg.train_tokens == cfg.lr_decay_tokens == 276_480
    assert cooldown_start(parent) == pytest.approx(230_400) and cooldown_start(cfg) == pytest.approx(165_888)
    assert cfg.lr_warmup_tokens == 27_648 and cfg.eval_every_tokens == 6_912
    changed = {k for k, v in cfg.to_dict().items() if parent.to_dict()[k] != v}
    assert changed == {"train_tokens", "lr_decay_tokens", "lr_warmup_tokens", "eval_every_tokens"}


def test_speedrun_8_changes_only_muons_schedule():
    parent, cfg = stage_config("speedrun_7_budget", "cpu"), stage_config("speedrun_8_muon_schedule", "cpu")
    changed = {k: v for k, v in cfg.to_dict().items() if parent.to_dict()[k] != v}
    assert changed == {"muon_lr_warmup": False, "muon_momentum_warmup_tokens": 76_800}
    assert learning_rate(cfg, 0) == 0.0 and learning_rate(cfg, 0, warmup=False) == cfg.lr  # AdamW's warms up


def test_speedrun_11s_budget_is_60_percent_of_speedrun_10s():
    """speedrun_11_budget's budget is 60% of speedrun_10's.

    speedrun_11_budget on the cpu profile: 165,888 tokens (54 steps of 3,072), the decay from 99,532.8 tokens (step 32),
    the warm-up a tenth of the budget; nothing else changes against speedrun_10."""
    parent, cfg = stage_config("speedrun_10_trigram", "cpu"), stage_config("speedrun_11_budget", "cpu")
    assert parent.train_tokens == 276_480 and cfg.train_tokens == cfg.lr_decay_tokens == 165_888
    assert cfg.train_tokens // cfg.tokens_per_step == 54 and cooldown_start(cfg) == pytest.approx(99_532.8)
    assert cfg.lr_warmup_tokens == 16_588 and cfg.eval_every_tokens == 4_147
    changed = {k for k, v in cfg.to_dict().items() if parent.to_dict()[k] != v}
    assert changed == {"train_tokens", "lr_decay_tokens", "lr_warmup_tokens", "eval_every_tokens"}

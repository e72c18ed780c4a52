"""The learning-rate schedule of training to a loss, in tokens: nanoGPT's cosine (every ladder's), or warm-up,
stable, decay (wsd: the speedrun ladder's).

wsd keeps the peak learning rate until the last lr_cooldown share of the schedule and then decays linearly to the
floor: most of the run learns at the peak, and the decay at the end brings the loss down (Hu et al. 2024, MiniCPM;
the modded-nanogpt speedruns). The timed protocol (lr_decay_tokens 0) keeps the learning rate constant.
"""

import math

import torch

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization

SCHEDULES = ("cosine", "wsd")


def learning_rate(cfg: TrainConfig, tokens: int) -> float:
    """The learning rate of the step that brings training to `tokens` tokens: a linear warm-up from 0 to cfg.lr over
    lr_warmup_tokens, then the decay to min_lr at lr_decay_tokens, min_lr after. lr_decay_tokens 0: cfg.lr throughout.
    cosine: a cosine decay from the end of the warm-up. wsd: cfg.lr until the last lr_cooldown share of
    lr_decay_tokens, then a linear decay."""
    if not cfg.lr_decay_tokens:
        return cfg.lr
    if tokens < cfg.lr_warmup_tokens:
        return cfg.lr * tokens / cfg.lr_warmup_tokens
    if cfg.lr_schedule == "wsd":
        start = cooldown_start(cfg)
        if tokens < start:
            return cfg.lr
        ratio = min(1.0, (tokens - start) / (cfg.lr_decay_tokens - start))
        return cfg.lr - ratio * (cfg.lr - cfg.min_lr)
    ratio = min(1.0, (tokens - cfg.lr_warmup_tokens) / (cfg.lr_decay_tokens - cfg.lr_warmup_tokens))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.lr - cfg.min_lr)


def cooldown_start(cfg: TrainConfig) -> float:
    """wsd: the tokens at which the linear decay begins."""
    return cfg.lr_decay_tokens * (1.0 - cfg.lr_cooldown)


def set_learning_rates(optimizer: torch.optim.Optimizer, cfg: TrainConfig, tokens: int) -> None:
    """Every param group at the schedule's share of its own peak learning rate (AdamW's groups: cfg.lr, so exactly
    learning_rate; Muon's: muon_lr, the same shape). The peak is each group's lr when first seen."""
    rate = learning_rate(cfg, tokens)
    for group in optimizer.param_groups:
        group["lr"] = rate * (group.setdefault("peak_lr", group["lr"]) / cfg.lr)  # x 1.0 for cfg.lr: exact


def _check_schedule(cfg: TrainConfig) -> None:
    if cfg.lr_schedule not in SCHEDULES:
        raise UserError(f"unknown lr_schedule {cfg.lr_schedule!r} (choose {' or '.join(SCHEDULES)})")
    if cfg.lr_schedule == "cosine":
        if cfg.lr_cooldown:
            raise UserError(f"lr_cooldown ({cfg.lr_cooldown}) is wsd's setting: the cosine schedule has none")
        return
    if not 0 < cfg.lr_cooldown <= 1:
        raise UserError(
            f"wsd needs 0 < lr_cooldown <= 1 (the share of the schedule spent decaying), got {cfg.lr_cooldown}"
        )
    if cfg.lr_decay_tokens and cooldown_start(cfg) < cfg.lr_warmup_tokens:
        raise UserError(
            f"wsd's decay would start at {cooldown_start(cfg):g} tokens, before the warm-up ends at "
            f"{cfg.lr_warmup_tokens} tokens: lower lr_cooldown"
        )


SCHEDULE = Optimization(
    name="wsd learning-rate schedule",
    fields=("lr_schedule", "lr_cooldown"),
    code="gpt/optimizations/schedule.py:learning_rate",
    checks=_check_schedule,
)

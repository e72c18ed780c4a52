"""The learning-rate schedule of training to a loss, in tokens: nanoGPT's cosine, or warm-up, stable, decay (wsd).

Cosine is every ladder's, wsd the speedrun's: the peak rate until the last lr_cooldown share, then a linear decay to
the floor (Hu et al. 2024, MiniCPM; the modded-nanogpt speedruns). The timed protocol keeps the rate constant.
"""

import math

import torch

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.optimization import Optimization, check_flag

SCHEDULES = ("cosine", "wsd")
MUON_MOMENTUM_START = 0.85  # Muon's momentum at the first step, with muon_momentum_warmup_tokens (modded-nanogpt's)


def learning_rate(cfg: TrainConfig, tokens: int, warmup: bool = True) -> float:
    """The learning rate of the step that brings training to `tokens` tokens.

    A linear warm-up to cfg.lr over lr_warmup_tokens (warmup=False: none), then the decay (cosine, or wsd's over the
    last lr_cooldown share) to min_lr at lr_decay_tokens, min_lr after; lr_decay_tokens 0: cfg.lr throughout."""
    if not cfg.lr_decay_tokens:
        return cfg.lr
    if tokens < cfg.lr_warmup_tokens and warmup:
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
    """Sets every param group at the schedule's share of its own peak learning rate (its lr when first seen).

    Muon's groups (told apart by their Newton-Schulz steps) skip the warm-up where muon_lr_warmup is False, and take
    muon_momentum(cfg, tokens) where muon_momentum_warmup_tokens is set."""
    rate = learning_rate(cfg, tokens)
    muon_rate = rate if cfg.muon_lr_warmup else learning_rate(cfg, tokens, warmup=False)
    for group in optimizer.param_groups:
        is_muon = "ns_steps" in group
        share = muon_rate if is_muon else rate
        group["lr"] = share * (group.setdefault("peak_lr", group["lr"]) / cfg.lr)  # x 1.0 for cfg.lr: exact
        if is_muon and cfg.muon_momentum_warmup_tokens:
            group["momentum"] = muon_momentum(cfg, tokens)


def muon_momentum(cfg: TrainConfig, tokens: int) -> float:
    """Muon's momentum of the step that brings training to `tokens` tokens.

    From MUON_MOMENTUM_START linearly to muon_momentum over muon_momentum_warmup_tokens, then muon_momentum
    (modded-nanogpt's momentum warm-up: a short memory while the gradients turn fast, early on)."""
    if not cfg.muon_momentum_warmup_tokens:
        return cfg.muon_momentum
    ratio = min(1.0, tokens / cfg.muon_momentum_warmup_tokens)
    return MUON_MOMENTUM_START + ratio * (cfg.muon_momentum - MUON_MOMENTUM_START)


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


def _check_muon_schedule(cfg: TrainConfig) -> None:
    check_flag(cfg, "muon_lr_warmup")
    tokens = cfg.muon_momentum_warmup_tokens
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise UserError(f"muon_momentum_warmup_tokens must be a non-negative integer, got {tokens!r}")
    if (tokens or not cfg.muon_lr_warmup) and cfg.matrix_optimizer != "muon":
        raise UserError("muon_lr_warmup and muon_momentum_warmup_tokens are Muon's schedule: they need Muon")
    if tokens and cfg.muon_momentum < MUON_MOMENTUM_START:
        raise UserError(
            f"the momentum warm-up rises from {MUON_MOMENTUM_START} to muon_momentum ({cfg.muon_momentum}): "
            "muon_momentum must be at least that"
        )


MUON_SCHEDULE = Optimization(
    name="Muon's schedule (no learning-rate warm-up, momentum warm-up)",
    fields=("muon_lr_warmup", "muon_momentum_warmup_tokens"),
    code="gpt/optimizations/schedule.py:set_learning_rates, muon_momentum",
    checks=_check_muon_schedule,
)


SCHEDULE = Optimization(
    name="wsd learning-rate schedule",
    fields=("lr_schedule", "lr_cooldown"),
    code="gpt/optimizations/schedule.py:learning_rate",
    checks=_check_schedule,
)

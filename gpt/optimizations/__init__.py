"""Every optimization of the ladders, each declared once in its home module beside the code it switches on
(gpt/optimizations/optimization.py says what a declaration holds), and the questions asked of all of them.

    feeding.py          bigger batch (speed_1), DataLoader workers (speed_2), pinned memory (speed_3),
                        pre-tokenised batches gathered on the device (fast_1)
    compilation.py      torch.compile (speed_4); compiled only where it pays within the run (speedrun)
    precision.py        autocast (speed_5), bf16 without a GradScaler and TF32 (fast_2)
    parallel.py         DDP (speed_6) and FSDP (memory_4); FSDP mixed precision (lean_1), CPU offload (lean_3)
    fused_attention.py  SDPA (fast_3; the code is the model's)
    padded_vocab.py     the vocabulary padded to a multiple of 64 (fast_4; the code is the model's)
    adamw.py            AdamW foreach=False (memory_3), fused AdamW (fast_5)
    chunked_loss.py     the chunked linear + cross-entropy (fast_6, lean_2)
    accumulation.py     gradient accumulation (memory_1; the loop is gpt/train.py:train_step's)
    checkpointing.py    activation checkpointing (memory_2)
    architecture.py     today's small-GPT blocks: ReLU², RMSNorm, QK-norm, zero-init projections, rotary; the x0
                        shortcut (speedrun; the code is the model's)
    muon.py             Muon for the blocks' matrices, AdamW for the rest (speedrun)
    schedule.py         the learning-rate schedule: cosine, or warm-up, stable, decay (wsd; speedrun); Muon's
                        own: no learning-rate warm-up, momentum warm-up (speedrun)
    host_memory.py      freed host memory kept for reuse by glibc's allocator (speedrun)
    ngram_embedding.py  a learned embedding of each (previous token, token) pair, and of each hashed triple (speedrun;
                        the code is the model's)

A stage script changes TrainConfig fields; each field belongs to exactly one optimization (`owner`), and what a
stage changes against its parent is a list of optimizations (`changed`), whose facts the ladder, the report and the
memory planner read from here. None of them names a field.
"""

from gpt.config import TrainConfig
from gpt.optimizations import (  # the speedrun ladder
    accumulation,
    adamw,
    architecture,
    checkpointing,
    chunked_loss,
    compilation,
    feeding,
    fused_attention,
    host_memory,
    muon,
    ngram_embedding,
    padded_vocab,
    parallel,
    precision,
    schedule,
)
from gpt.optimizations.optimization import Optimization, SimulationPlan

# In ladder order: speed, fast, memory, lean, speedrun.
OPTIMIZATIONS: tuple[Optimization, ...] = (
    feeding.BIGGER_BATCH,
    feeding.WORKERS,
    feeding.PINNED_MEMORY,
    compilation.COMPILE,
    precision.AMP,
    parallel.DATA_PARALLEL,
    feeding.ON_DEVICE_BATCHES,
    precision.BF16,
    precision.TF32,
    fused_attention.FUSED_ATTENTION,
    padded_vocab.PADDED_VOCAB,
    adamw.FUSED_ADAMW,
    chunked_loss.CHUNKED_LOSS,
    accumulation.GRADIENT_ACCUMULATION,
    checkpointing.ACTIVATION_CHECKPOINTING,
    adamw.FOREACH_OFF,
    parallel.FSDP_MIXED_PRECISION,
    parallel.CPU_OFFLOAD,
    architecture.MODERN_ARCHITECTURE,
    muon.MUON,
    schedule.SCHEDULE,
    ngram_embedding.BIGRAM_EMBEDDING,
    schedule.MUON_SCHEDULE,
    architecture.X0_SHORTCUT,
    ngram_embedding.TRIGRAM_EMBEDDING,
    compilation.COMPILE_IF_IT_PAYS,
    host_memory.HOST_MEMORY,
)
_OWNER = {f: opt for opt in OPTIMIZATIONS for f in opt.fields}


def owner(field: str) -> Optimization | None:
    """The optimization a TrainConfig field switches on (None: a field of the run, not of an optimization)."""
    return _OWNER.get(field)


def changed(before: dict, after: dict) -> list[Optimization]:
    """The optimizations whose fields differ between two configs (TrainConfig.to_dict(), or a record's
    'config'), in the order of their first changed field."""
    fields = [f for f, v in after.items() if f in _OWNER and before.get(f) != v]
    return list(dict.fromkeys(_OWNER[f] for f in fields))


def validate(cfg: TrainConfig) -> TrainConfig:
    """`cfg`, checked: a UserError for its first bad setting, the run's own first (TrainConfig.check_run_settings:
    gpt.config knows no optimization), then the first an optimization cannot take."""
    cfg.check_run_settings()
    for opt in OPTIMIZATIONS:
        if opt.checks:
            opt.checks(cfg)
    return cfg


def why_no_effect(optimizations: list[Optimization], cfg, device) -> str | None:
    """'no effect on <device>: <why>' when every one of `optimizations` changes nothing on `device`, else None."""
    reasons = [opt.no_effect(cfg, device) if opt.no_effect else None for opt in optimizations]
    if not reasons or None in reasons:
        return None
    return f"no effect on {device.type}: " + "; ".join(dict.fromkeys(reasons))


def why_cannot_run(cfg, device_type: str) -> str | None:
    """Why a stage with `cfg` cannot run on this machine (a 'skipped' record), or None. The latest optimization of
    the ladders speaks first: its reason is the one this stage adds."""
    reasons = (opt.cannot_run(cfg, device_type) for opt in reversed(OPTIMIZATIONS) if opt.cannot_run)
    return next((r for r in reasons if r), None)


def model_settings(cfg, device_type: str, vocab_size: int) -> dict:
    """The GPTConfig fields the optimizations set (attention, vocabulary padding, the loss)."""
    settings = {}
    for opt in OPTIMIZATIONS:
        if opt.model:
            settings.update(opt.model(cfg, device_type, vocab_size))
    return settings


def plan_simulation(plan: SimulationPlan) -> SimulationPlan:
    """Every optimization rewrites the memory planner's plan: what it cannot simulate, and how it stands in."""
    for opt in OPTIMIZATIONS:
        if opt.simulate:
            opt.simulate(plan)
    return plan


def unseen_memory(cfg, raw, target: str) -> list[tuple[float, str, str]]:
    """Memory the planner's simulation does not see, as (MiB, what, where) for each optimization that adds some."""
    found = (opt.unseen_memory(cfg, raw, target) for opt in OPTIMIZATIONS if opt.unseen_memory)
    return [f for f in found if f]


def time_targets(optimizations: list[Optimization]) -> list[str]:
    """The shares of a step's time these optimizations act on, each once."""
    return list(dict.fromkeys(c for opt in optimizations for c in opt.time_targets))


def no_speedup(optimizations: list[Optimization], record: dict, parent: dict) -> str | None:
    """The first measured reason one of `optimizations` gives for not making the step faster, or None."""
    reasons = (opt.no_speedup(record, parent) for opt in optimizations if opt.no_speedup)
    return next((r for r in reasons if r), None)

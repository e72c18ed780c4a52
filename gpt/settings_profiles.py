"""Profiles: the base settings of each ladder's baseline stage, declared here and nowhere else.

reference (the documented setup, ../shared/reference/README.md; default with CUDA), cpu (the four ladders in under
half an hour on 2 cores; default without CUDA), smoke (the tests'): what each holds, and why the cpu profile's
shapes: docs/running.md#profiles-gptsettings_profilespy. Each also has "time_to_loss" (`_to_a_loss` derives it) and
"speedrun", the speedrun's task. Stage scripts change these settings, so every profile runs every stage.
"""

from gpt.errors import UserError

_REFERENCE_TRAINING = dict(dropout=0.1, attention="naive", seed=3407)
# Training to a loss (the speed and fast ladders from scratch, README "Time to loss"): nanoGPT's shakespeare_char
# optimizer settings (AdamW lr 1e-3, beta2 0.99, warm-up 100 steps, cosine decay to lr/10 at the budget's end),
# in tokens of the baseline's batch so every stage follows one schedule. The budget is the decay's end.
EVALUATIONS = 40  # per budget (also one given on the command line): an interpolated crossing stays near the curve


def budget_settings(tokens: int, warmup_tokens: int) -> dict:
    """The settings of a run to a loss on a budget of `tokens` (a stage's own budget, --train-tokens).

    The schedule ends there, the evaluations keep their number, and the warm-up stays, within the
    budget's first tenth."""
    return dict(
        train_tokens=tokens,
        lr_decay_tokens=tokens,
        eval_every_tokens=tokens // EVALUATIONS,
        lr_warmup_tokens=min(warmup_tokens, tokens // 10),
    )


def cut_budget(cfg, share: float) -> None:
    """A speedrun stage's shorter budget: `share` of the config's own, its schedule and evaluations with it."""
    for key, value in budget_settings(int(cfg.train_tokens * share), cfg.lr_warmup_tokens).items():
        setattr(cfg, key, value)


def _to_a_loss(batch: int, block: int, steps: int, evals: int = EVALUATIONS, warmup_steps: int = 100, **shape) -> dict:
    tokens = steps * batch * block
    return dict(
        **shape,
        data_dir="data/shakespeare_char",
        dataset="raw_text",
        block_size=block,
        batch_size=batch,
        samples=batch * 16,
        repeats=1,
        warmup_iters=0,
        seed=3407,
        attention="naive",
        train_tokens=tokens,
        eval_every_tokens=tokens // evals,
        lr=1e-3,
        betas=(0.9, 0.99),
        min_lr=1e-4,
        lr_warmup_tokens=warmup_steps * batch * block,
        lr_decay_tokens=tokens,
    )


# The speedrun's task: the cpu profile's time to loss, one on every machine (docs/speedrun.md#what-it-is).
SPEEDRUN = "speedrun"  # the profiles' section of the speedrun's task, named after its ladder
SPEEDRUN_TASK = _to_a_loss(
    batch=12, block=64, steps=2000, preset="gpt-mini", n_layer=4, n_head=4, n_embd=128, dropout=0.0, eval_windows=200
)
_SMOKE_TO_A_LOSS = _to_a_loss(
    batch=4,
    block=32,
    steps=150,
    evals=5,
    warmup_steps=10,
    preset="gpt-mini",
    n_layer=2,
    n_head=2,
    n_embd=32,
    dropout=0.0,
    eval_windows=32,
)

PROFILES = {
    "reference": {
        "speed": dict(
            preset="gpt-mini",
            data_dir="data/shakespeare_char",
            dataset="raw_text",
            block_size=128,
            batch_size=32,
            samples=10240,
            repeats=5,
            warmup_iters=10,
            **_REFERENCE_TRAINING,
        ),
        "memory": dict(
            preset="gpt2-large",
            data_dir="data/shakespeare_char",
            dataset="tokens",
            block_size=128,
            batch_size=32,
            samples=1024,
            repeats=5,
            warmup_iters=10,
            **_REFERENCE_TRAINING,
        ),
        # the speed ladder's shape (GPT-mini, block 128, batch 32) on ~10M tokens: not measured on a GPU yet
        "time_to_loss": _to_a_loss(batch=32, block=128, steps=2500, preset="gpt-mini", dropout=0.1, eval_windows=512),
        SPEEDRUN: SPEEDRUN_TASK,
    },
    "cpu": {
        "speed": dict(
            preset="gpt-mini",
            data_dir="data/shakespeare_gpt2",
            dataset="raw_text",
            block_size=64,
            batch_size=8,
            samples=128,
            repeats=3,
            warmup_iters=2,
            profile_steps=1,
            **_REFERENCE_TRAINING,
        ),
        "memory": dict(
            preset="gpt2-large",
            n_embd=320,
            n_head=5,
            data_dir="data/shakespeare_char",
            dataset="tokens",
            block_size=128,
            batch_size=12,
            samples=24,
            repeats=2,
            warmup_iters=1,
            profile_steps=1,
            **_REFERENCE_TRAINING,
        ),
        # nanoGPT's CPU recipe for shakespeare_char: the speedrun's task, so one run of speed_0 serves both sections
        "time_to_loss": SPEEDRUN_TASK,
        SPEEDRUN: SPEEDRUN_TASK,
    },
    "smoke": {
        "speed": dict(
            preset="gpt-mini",
            n_layer=2,
            n_head=2,
            n_embd=32,
            data_dir="data/shakespeare_char",
            dataset="raw_text",
            block_size=32,
            batch_size=2,
            samples=32,
            repeats=2,
            warmup_iters=1,
            **_REFERENCE_TRAINING,
        ),
        "memory": dict(
            preset="gpt2-large",
            n_layer=4,
            n_head=4,
            n_embd=64,
            data_dir="data/shakespeare_char",
            dataset="tokens",
            block_size=32,
            batch_size=8,
            samples=16,
            repeats=2,
            warmup_iters=1,
            **_REFERENCE_TRAINING,
        ),
        "time_to_loss": _SMOKE_TO_A_LOSS,
        SPEEDRUN: _SMOKE_TO_A_LOSS,  # the tests' tiny task, the only one that shrinks the speedrun's
    },
}


def default_profile(device_type: str) -> str:
    return "reference" if device_type == "cuda" else "cpu"


def speedrun_task_is_time_to_loss(profile: str) -> bool:
    """Whether the profile's time-to-loss settings are the speedrun's task (cpu, smoke; not reference's GPT-mini).

    Then one run of speed_0's seeds serves both sections: the time to loss and the speedrun's target."""
    return profile_settings(profile, "time_to_loss") == profile_settings(profile, SPEEDRUN)


def profile_settings(profile: str, ladder: str) -> dict:
    if profile not in PROFILES:
        raise UserError(f"unknown profile {profile!r} (choose one of: {', '.join(PROFILES)})")
    return dict(PROFILES[profile][ladder])

"""The ladders: their order (declared here once), each stage's place in them, and how a stage's config is built.

A stage's config is its profile's baseline settings with the `change()` of every stage up to and including
it applied in ladder order, so each stage keeps every earlier change of its ladder. The two ladders beyond
the book start from a stage of a documented ladder (STARTS_FROM) and keep every change up to it. What a stage
script runs when it is called is gpt/stage.py.
"""

import importlib.util

from gpt import optimizations
from gpt.config import TrainConfig
from gpt.data import REPO_ROOT
from gpt.errors import UserError
from gpt.profiles import profile_settings

STAGES_DIR = REPO_ROOT / "stages"

LADDERS = {
    "speed": [
        "speed_0_baseline",
        "speed_1_batch_size",
        "speed_2_num_workers",
        "speed_3_non_blocking",
        "speed_4_compile",
        "speed_5_amp",
        "speed_6_ddp",
    ],
    # Beyond the book: today's standard optimizations, one at a time. The order, and why:
    # 1. remove the host-side work first (data), so every later stage is measured with the device fed;
    # 2. then the precision practitioners train in (bf16, no loss scaling; TF32), so the kernel-level stages
    #    after it are measured in that precision;
    # 3. then the kernels, in build-nanogpt's order: fused attention, padded vocabulary, fused AdamW;
    # 4. last the chunked loss, which changes how the output layer computes rather than what it computes.
    "fast": [
        "fast_1_pretokenized",
        "fast_2_bf16",
        "fast_3_sdpa",
        "fast_4_padded_vocab",
        "fast_5_fused_adamw",
        "fast_6_chunked_loss",
    ],
    "memory": [
        "memory_0_baseline",
        "memory_1_grad_accum",
        "memory_2_checkpointing",
        "memory_3_foreach_off",
        "memory_4_fsdp",
    ],
    # Memory beyond the book, on top of FSDP. The order, and why: halve what FSDP gathers and what the blocks
    # keep first (bf16 parameters for compute); then the largest single activation left (the logits); last
    # CPU offload, which costs the most time, so the stages before it are not measured behind its copies.
    "lean": ["lean_1_fsdp_bf16", "lean_2_chunked_loss", "lean_3_cpu_offload"],
    # The speedrun: speed_0's model, sooner. Every stage trains to a loss and is judged by its seconds to speed_0's
    # final validation loss (docs/speedrun.md). The order, and why: first the systems changes that keep the model
    # (their gain per sample should carry over whole at the baseline's batch), then the training changes, each kept
    # only where it reached the target sooner than its parent on every seed; what was tried is logged there.
    "speedrun": [
        "speedrun_1_systems",
        "speedrun_2_batch_lr",
        "speedrun_3_muon",
        "speedrun_4_architecture",
        "speedrun_5_wsd",
        "speedrun_6_bigram",
        "speedrun_7_budget",
        "speedrun_8_muon_schedule",
        "speedrun_9_x0_shortcut",
        "speedrun_10_trigram",
        "speedrun_11_budget",
    ],
}
# A ladder beyond the book continues from this stage of a documented ladder (its settings and profile).
STARTS_FROM = {"fast": "speed_5_amp", "lean": "memory_4_fsdp", "speedrun": "speed_0_baseline"}

# What each ladder lowers: "time" ladders get the report's speed table and plot, "memory" ladders the memory ones,
# and their stages run with it as TrainConfig.goal (a time run drops a kernel measured slower here; a memory run
# keeps a memory saving).
LADDER_GOAL = {"speed": "time", "fast": "time", "memory": "memory", "lean": "memory", "speedrun": "time"}


def ladder_of(stage: str) -> str:
    for ladder, stages in LADDERS.items():
        if stage in stages:
            return ladder
    known = ", ".join(s for stages in LADDERS.values() for s in stages)
    raise UserError(f"unknown stage {stage!r} (known: {known})")


def parent_of(stage: str) -> str | None:
    ladder = ladder_of(stage)
    stages = LADDERS[ladder]
    i = stages.index(stage)
    return stages[i - 1] if i else STARTS_FROM.get(ladder)


def lineage(stage: str) -> list[str]:
    """Every stage whose change this stage keeps, in order, ending with the stage itself."""
    chain = [stage]
    while parent_of(chain[0]):
        chain.insert(0, parent_of(chain[0]))
    return chain


def base_ladder(ladder: str) -> str:
    """The documented ladder whose profile settings a ladder uses."""
    return ladder_of(STARTS_FROM[ladder]) if ladder in STARTS_FROM else ladder


def load_stage(stage: str):
    """The stage script as a module (its docstring, CHANGE, REFERENCE and change())."""
    ladder_of(stage)
    path = STAGES_DIR / f"{stage}.py"
    spec = importlib.util.spec_from_file_location(f"stages.{stage}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The ladders whose stages also train to a loss (gpt/time_to_loss.py); the memory and lean ladders keep their
# parent's trajectory (their equivalence tests), so their time to loss is their time per token.
TRAINED_TO_A_LOSS = ("speed", "fast")
# The ladders that only train to a loss (no timed protocol): their stages run on the time-to-loss settings always,
# with records in <out>/<ladder>/, and run_all runs them in a section of their own.
ONLY_TO_A_LOSS = ("speedrun",)
TIMED_LADDERS = tuple(ladder for ladder in LADDERS if ladder not in ONLY_TO_A_LOSS)


def trains_to_a_loss_only(stage: str) -> bool:
    return ladder_of(stage) in ONLY_TO_A_LOSS


def stage_config(stage: str, profile: str, to_a_loss: bool = False, **overrides) -> TrainConfig:
    """Profile baseline + every change of the ladder up to `stage`, then explicit overrides. to_a_loss: the
    profile's settings for training to a loss (a stage of the speed or fast ladder) instead of the timed ones."""
    ladder = ladder_of(stage)
    to_a_loss = to_a_loss or ladder in ONLY_TO_A_LOSS
    if to_a_loss and ladder not in TRAINED_TO_A_LOSS + ONLY_TO_A_LOSS:
        raise UserError(
            f"{stage} is not trained to a loss: the {ladder} ladder keeps its parent's trajectory (tests/"
            "test_ladder_equivalence.py), so its time to loss is its time per token"
        )
    settings = profile_settings(profile, "time_to_loss" if to_a_loss else base_ladder(ladder))
    settings["data_dir"] = str(REPO_ROOT / settings["data_dir"])
    cfg = TrainConfig(**settings, goal=LADDER_GOAL[ladder])
    for name in lineage(stage):
        load_stage(name).change(cfg)
    # a speedrun stage is judged by its time to the target alone: training on past it would only cost the run time
    cfg.stop_at_target = ladder in ONLY_TO_A_LOSS
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    return optimizations.validate(cfg)

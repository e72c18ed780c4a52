"""Speedrun, stage 1: the fast ladder's systems changes, at the baseline's batch.

Parent: speed_0_baseline. No anchor figure: a speedrun stage is judged against speed_0 in the same run. On its
time-to-loss settings (gpt/settings_profiles.py: the cpu profile is nanoGPT's CPU recipe for character-level
Shakespeare: 4 layers of 128, block 64, batch 12, AdamW 1e-3 with a cosine schedule over 2,000 steps). Keeps the
model: the target is speed_0's final validation loss.

The book's ladder multiplies the batch by 8 before its first systems change, and at this scale 250 steps of 96
samples train a worse model than 2,000 of 12 (results.md, "Time to loss"): no later stage reaches the baseline's
loss. Here every change of the speed and fast ladders that keeps the mathematics of a step is switched on and the
batch is kept: compile, autocast (bf16 where this device multiplies it faster, measured; fp32 otherwise), batches
gathered on the device from pre-tokenised data, bf16 without a GradScaler and TF32, fused attention, the padded
vocabulary, fused AdamW, the chunked loss (each where it is faster here: the goal is time). Their gains per sample
should carry over to the time to the target whole, less the per-step overhead that weighs more in a small step.
Code: each stage's own home, through its change() (the stages named below).
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "the fast ladder's systems changes at the baseline's batch"
KIND = "systems"  # keeps the model
# Every stage of the speed and fast ladders whose change keeps the mathematics of a step (not speed_1's batch x8,
# not speed_6's second process; speed_2 and speed_3 feed a DataLoader that fast_1 replaces).
SYSTEMS_STAGES = (
    "speed_4_compile",
    "speed_5_amp",
    "fast_1_pretokenized",
    "fast_2_bf16",
    "fast_3_sdpa",
    "fast_4_padded_vocab",
    "fast_5_fused_adamw",
    "fast_6_chunked_loss",
)


def change(cfg):
    from gpt.ladder import load_stage  # here, not at the top: loading this script imports nothing from gpt

    for stage in SYSTEMS_STAGES:
        load_stage(stage).change(cfg)


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

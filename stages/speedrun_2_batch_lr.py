"""Speedrun, stage 2: a larger batch and learning rate, the batch the first noise-scale measurement chose.

Parent: speedrun_1_systems. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes
the training (not the model): the target stays speed_0's final loss.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training") predict the steps to a loss as
S_min (1 + B_noise / B): a batch well below the gradient noise scale B_noise wastes steps, one well above it wastes
samples. `python -m gpt.noise_scale` measures B_simple along speed_0's run (the squared gradient norms of each batch
and of its two halves, their running means kept apart before dividing) and the step time t(B) on this device, and
prints the batch that minimises the predicted time (1 + B_noise / B) t(B).

What chose this stage's batch: that command's first run, on another CPU, whose step times came from graphs
compiled with dynamic shapes (docs/speedrun.md, "What chose speedrun_2's batch"). Its B_noise stands; its step
times do not. Measured since with each batch compiled on its own (records/<profile>-<device>/speedrun/
noise_scale.json, "choice"), the choice moves with the CPU and from run to run on one CPU: batch 24 and batch 48
are predicted within a few percent of each other. The stage keeps 48; its own time to the target, not the
prediction, is its judge: batch 24 at this stage's other settings, trained on the tuning seeds, was 1.11x sooner
here and 0.83x at the last stage (docs/speedrun.md, the log of 2026-11-27). The learning rate is not the
measurement's either: its suggestion, the square-root rule for Adam, did not reach the target at this batch, and the
linear rule did (the speedrun log). beta2 keeps its half-life in tokens (beta2 ** factor); the warm-up is in tokens
already (gpt/settings_profiles.py). Code: gpt/noise_scale.py (the measurement), the batch and the schedule's settings
below.
"""

BATCH_FACTOR = 4  # x the baseline's batch (12 -> 48 on the cpu profile): the first measurement's choice
LR_FACTOR = 4.0  # swept up from the square-root rule (x2: not reached); x4 reached the target (docs/speedrun.md)

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"batch x{BATCH_FACTOR} (the first noise-scale measurement's choice), learning rate x{LR_FACTOR:g} (swept)"
KIND = "training"


def change(cfg):
    cfg.batch_size *= BATCH_FACTOR
    cfg.lr *= LR_FACTOR
    cfg.min_lr *= LR_FACTOR
    cfg.betas = (cfg.betas[0], cfg.betas[1] ** BATCH_FACTOR)  # the same half-life in tokens


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

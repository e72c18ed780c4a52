"""Speedrun, stage 2: the batch and the learning rate from a measurement, not a factor.

Parent: speedrun_1_systems. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes
the training (not the model): the target stays speed_0's final loss.

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training") predict the steps to a loss as
S_min (1 + B_noise / B): a batch well below the gradient noise scale B_noise wastes steps, one well above it wastes
samples. `python -m gpt.noise_scale` measures B_simple along speed_0's run (the squared gradient norms of each batch
and of its two halves, their running means kept apart before dividing) and the step time t(B) on this device, and
picks the batch that minimises the predicted time (1 + B_noise / B) t(B). The learning rate follows the batch by the
square-root rule for Adam, then a small sweep; the warm-up is in tokens already (gpt/profiles.py), and beta2 keeps
its half-life in tokens (beta2 ** factor). What the measurement gave here: docs/speedrun.md, "Choosing the batch".
Code: gpt/noise_scale.py (the measurement), the batch and the schedule's settings below.
"""
from gpt.stage import stage_main

BATCH_FACTOR = 4  # x the baseline's batch (12 -> 48 on the cpu profile): the measured choice
LR_FACTOR = 4.0  # swept up from the square-root rule (x2: not reached); x4 reached the target (docs/speedrun.md)

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"batch x{BATCH_FACTOR}, learning rate x{LR_FACTOR:g} (from the measured gradient noise scale)"
KIND = "training"


def change(cfg):
    cfg.batch_size *= BATCH_FACTOR
    cfg.lr *= LR_FACTOR
    cfg.min_lr *= LR_FACTOR
    cfg.betas = (cfg.betas[0], cfg.betas[1] ** BATCH_FACTOR)  # the same half-life in tokens


if __name__ == "__main__":
    stage_main(__file__)

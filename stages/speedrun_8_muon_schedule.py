"""Speedrun, stage 8: Muon's own schedule: no learning-rate warm-up for its matrices, and its momentum warmed up.

Parent: speedrun_7_budget. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes the
training (not the model): the target stays speed_0's final loss.

Muon's update is orthogonalised, so its size does not depend on the gradient's scale, and the modded-nanogpt
speedruns train its matrices at the peak rate from the first step (AdamW's groups keep their warm-up, whose second
moments need it). Its momentum instead starts short, 0.85, while the gradients turn fast, and rises linearly to
0.95 (Keller Jordan, modded-nanogpt's record log). Here over 25 steps of the speedrun's batch (76,800 tokens of
48 x 64: the tokens of speed_0's warm-up, 100 steps of 12). Code: gpt/optimizations/schedule.py:set_learning_rates,
muon_momentum.
"""

MOMENTUM_WARMUP_STEPS = 25  # steps of this stage's batch: speed_0's 100 warm-up steps of a quarter of it

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "Muon without learning-rate warm-up, its momentum warmed up from 0.85 to 0.95"
KIND = "training"


def change(cfg):
    cfg.muon_lr_warmup = False
    cfg.muon_momentum_warmup_tokens = MOMENTUM_WARMUP_STEPS * cfg.tokens_per_step  # the schedule counts tokens


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

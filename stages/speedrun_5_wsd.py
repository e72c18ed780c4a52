"""Speedrun, stage 5: a schedule that ends at the target (warm-up, stable, linear decay), on a shorter budget.

Parent: speedrun_4_architecture. No anchor figure: a speedrun stage is judged against speed_0 in the same run. After
the other training changes, because its budget is the shortest that every change before it allows. Changes the
training (not the model): the target stays speed_0's final loss.

A cosine schedule spends most of the budget at a falling learning rate; the warm-up-stable-decay (trapezoid)
schedule holds the peak and decays linearly over the last part (Hu et al. 2024, MiniCPM; Hägele et al. 2024), and
the loss drops steeply during that decay. Since finishing sooner is the point, the budget is cut to the shortest
that still reached the target on every seed here (docs/speedrun.md, its log).
Code: gpt/optimizations/schedule.py:learning_rate.
"""

BUDGET = 0.25  # of the parent's token budget: 30% reached the target at 359k tokens (3 seeds), 25% at 342k, every seed
COOLDOWN = 0.4  # the share of the budget spent decaying

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"warm-up-stable-decay schedule ({COOLDOWN:.0%} decay) on {BUDGET:.0%} of the tokens"
KIND = "training"


def change(cfg):
    from gpt.settings_profiles import cut_budget  # here, not at the top: loading this script imports nothing from gpt

    cfg.lr_schedule = "wsd"
    cfg.lr_cooldown = COOLDOWN
    cut_budget(cfg, BUDGET)


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

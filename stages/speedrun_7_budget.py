"""Speedrun, stage 7: the token budget cut to what the bigram table leaves needed, so the decay comes sooner.

Parent: speedrun_6_bigram. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes the
training (not the model): the target stays speed_0's final loss.

speedrun_5's budget was cut for the model without the bigram table; with it, speedrun_6 reached the target with about
a third of that budget left, at the very start of the wsd decay (Hu et al. 2024, MiniCPM; Hägele et al. 2024: the
loss falls steeply during the decay, wherever it is placed). A shorter budget moves the decay, the same 40% share,
forward to where the target is, and the loss reaches it sooner (docs/speedrun.md, its log: swept on the tuning seeds
1, 2, 3, not on the reported ones). Code: gpt/settings_profiles.py:cut_budget, gpt/optimizations/schedule.py.
"""

BUDGET = 0.72  # of the parent's token budget (384,000 -> 276,480 tokens): the log in docs/speedrun.md

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"the token budget cut to {BUDGET:.0%} of speedrun_6's, the wsd decay moved forward with it"
KIND = "training"


def change(cfg):
    from gpt.settings_profiles import cut_budget  # here, not at the top: loading this script imports nothing from gpt

    cut_budget(cfg, BUDGET)


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Speedrun, stage 11: the token budget cut again, to what the trigram table leaves needed.

Parent: speedrun_10_trigram. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes
the training (not the model): the target stays speed_0's final loss.

With the trigram table the model reaches the target at step 50-54 of speedrun_7's 90, around the start of the wsd
decay, so the decay again comes too late (Hu et al. 2024, MiniCPM; Hägele et al. 2024). The budget is cut to 60% of
the parent's; the decay keeps its 40% share, and starts at step 32 of 54. 75% and 80% were not sooner on every tuning
seed (docs/speedrun.md, its log: swept on the seeds 1, 2, 3, not on the reported ones). Code:
gpt/settings_profiles.py:budget_settings, gpt/optimizations/schedule.py.
"""

BUDGET = 0.6  # of the parent's token budget (276,480 -> 165,888 tokens): the log in docs/speedrun.md

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"the token budget cut to {BUDGET:.0%} of speedrun_10's, the wsd decay moved forward with it"
KIND = "training"


def change(cfg):
    from gpt.settings_profiles import cut_budget  # here, not at the top: loading this script imports nothing from gpt

    cut_budget(cfg, BUDGET)


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Speedrun, stage 15: the warm-up-stable-decay schedule decays over 80% of the budget instead of 40%.

Parent: speedrun_14_adamw_rate. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes
the training (not the model): the target stays speed_0's final loss.

What held the parent back: the decay's share was chosen at speedrun_5, on a budget of 384,000 tokens (125 steps), and
kept through two budget cuts (speedrun_7, speedrun_11) and two changes of the rates (speedrun_8's schedule for Muon,
speedrun_14's AdamW rate). At 54 steps its decay starts at step 32 and the target falls at steps 40-45, so most of the
run is spent at the peak rates. Swept at this stage on the tuning seeds 3410-3412: a decay over 60%, 80% and 90% of
the budget took 4-9%, 5-10% and 6-10% fewer tokens to the target than 40%; 80% and 90% were within 1% of each other on
every seed, and 80%, the smaller move, was kept. On the reported seeds it took 4-7% fewer (docs/speedrun.md, the log
of 2026-11-28). A stage kept for its tokens. The warm-up, the budget, the rates and Muon's momentum are untouched; the
decay now begins right after the warm-up's 10%.
Code: gpt/optimizations/schedule.py:learning_rate.
"""

COOLDOWN = 0.8  # the share of the budget spent decaying (speedrun_5's 0.4): swept 0.6, 0.8, 0.9 on the tuning seeds

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"the wsd schedule's decay over {COOLDOWN:.0%} of the budget (speedrun_5's 40%), swept"
KIND = "training"


def change(cfg):
    cfg.lr_cooldown = COOLDOWN


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

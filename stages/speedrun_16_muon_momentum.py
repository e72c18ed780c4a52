"""Speedrun, stage 16: Muon's momentum 0.85 throughout, instead of rising from 0.85 to 0.95 over 25 steps.

Parent: speedrun_15_longer_decay. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
Changes the training (not the model): the target stays speed_0's final loss.

What held the parent back: speedrun_8 took modded-nanogpt's momentum schedule (0.85 rising to 0.95), made for runs of
thousands of steps, into a race of 125 steps, since cut to about 40: a momentum of 0.95 averages the last ~20 updates,
half of this run, and the parent took most of its steps at it. Swept at the parent on the tuning seeds 3410-3412: 0.9,
0.85 and 0.8; 0.85 and 0.8 took about as many tokens, and fewer than 0.9 on every seed; 0.85, the smaller move and the
warm-up's own start, was kept (the tokens of each, and the reported seeds': docs/speedrun.md, the log of 2026-11-28,
evening). With it speedrun_8's warm-up starts and ends at 0.85: the momentum is 0.85 at every step. A stage kept for
its tokens: the step is the parent's.
Code: gpt/optimizations/schedule.py:muon_momentum.
"""

MOMENTUM = 0.85  # Muon's momentum (speedrun_8's peak 0.95): swept 0.9, 0.85, 0.8 on the tuning seeds

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"Muon's momentum {MOMENTUM} throughout (speedrun_8's rose from 0.85 to 0.95), swept"
KIND = "training"


def change(cfg):
    cfg.muon_momentum = MOMENTUM


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

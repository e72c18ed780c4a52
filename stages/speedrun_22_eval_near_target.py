"""Speedrun, stage 22: no evaluation while the last step's training loss is far above the target.

Parent: speedrun_21_plain_optimizer. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
KEEPS THE MODEL: the training is untouched, and the crossing is read at the same evaluations.

What held the parent back: its evaluations. In a first run of the parent on 2 CPU cores (8.6 s, launch to exit) they
took 2.4 s beside 3.9 s of training: 23 of them for 22 steps, one at every step. The first seven, while the loss fell
from 4.4 to 2.3 against a target of 1.895, read the estimate's 48 windows each (gpt/evaluation.py: TowardTarget) only
to find the loss clearly above the target. The step's own training loss, computed anyway, says as much: while it is
more than FAR_MARGIN (0.5 nats) above the target the evaluation is skipped, no window read, no point on the curve.
Code: gpt/optimizations/evaluation_screen.py, called by gpt/time_to_loss.py:evaluation_of.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "no evaluation while the last step's training loss is over 0.5 nats above the target"
KIND = "systems"


def change(cfg):
    cfg.eval_near_target_only = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

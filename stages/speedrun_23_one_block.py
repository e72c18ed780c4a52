"""Speedrun, stage 23: one transformer block instead of four.

Parent: speedrun_22_eval_near_target. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
CHANGES THE MODEL: three of its four blocks removed (198,080 parameters each, four of Muon's matrices); the target
stays speed_0's final loss.

What held the parent back: its blocks. On 2 CPU cores, 30 steps of each alternated in one process, the parent's step
took 132 ms and the same step with one block 46 ms: about 29 ms a block, two thirds of the step in the three
removed. Yet the tokens to the target hardly depend on the depth: the n-gram tables (speedrun_6, 10 and 17) give
every position a vector for its last two, three and four characters, and what more blocks add beyond them is little
at this loss. On the tuning seeds (3410-3412) 4 blocks took 63,282-66,374 tokens, 3 blocks 65,020-66,036, 2 blocks
64,420-65,920 and 1 block 66,496-67,264, in 3.0-3.3, 2.5-2.8, 1.9-2.2 and 1.0-1.1 s of training (docs/speedrun.md,
the log of 2026-12-04). Code: the preset's depth override (gpt/config.py:TrainConfig.model_shape), set here;
gpt/model.py builds the blocks.
"""

N_LAYER = 1  # blocks; the speedrun's task has 4 (nanoGPT's CPU recipe), every profile's speedrun the same 1

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"{N_LAYER} transformer block instead of the task's 4: the n-gram tables carry the context"
KIND = "model"


def change(cfg):
    cfg.n_layer = N_LAYER


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

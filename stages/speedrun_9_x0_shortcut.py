"""Speedrun, stage 9: the embedding mixed into every block's input by two learned scalars per block (x0 shortcut).

Parent: speedrun_8_muon_schedule. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
CHANGES THE MODEL: 2 scalars per block (8 parameters), starting at 1 and 0, so the first forward is the parent's; the
target stays speed_0's final loss.

Each block's input is a_i * x + b_i * x0, where x is the residual stream and x0 the embedding (token plus bigram):
every block can read the tokens themselves, however much the blocks before it have written over them (modded-nanogpt's
record log, its "x0 lambdas"; nanochat likewise). Code: gpt/model.py (GPTConfig.x0_shortcut), switched on by
gpt/optimizations/architecture.py:X0_SHORTCUT.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "an x0 shortcut: each block's input a learned mix of the residual stream and the embedding"
KIND = "model"


def change(cfg):
    cfg.x0_shortcut = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

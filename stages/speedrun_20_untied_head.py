"""Speedrun, stage 20: the output head its own matrix instead of the token embedding's (an untied head).

Parent: speedrun_19_gc_freeze. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
CHANGES THE MODEL: a second vocab x n_embd matrix (65 x 128 here, 8,320 parameters); the target stays speed_0's final
loss.

What held the parent back: its tokens. Its step is the four-gram table's and the blocks' exact arithmetic (the
systems stages since speedrun_17 moved seconds, not tokens), and the one tied matrix serves two jobs that pull apart:
as the embedding it says what a character is, as the head which character comes next. Untied, the head starts as the
parent's tied matrix (GPT.init_weights draws it last, as the tied one's last draw was) and the embedding as a draw
of its own; AdamW updates both at the parent's rate, the head with the Linear weights' decay and the embedding,
no longer a Linear's weight, without; Muon neither (not a block's matrix). On the tuning seeds it took 13-18% fewer
tokens; untied heads zero at the start, or drawn with another seed, were tried (docs/speedrun.md, the log of
2026-12-02, morning). Code: gpt/model.py (GPTConfig.untied_head), switched on by
gpt/optimizations/architecture.py:UNTIED_HEAD.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "the output head untied from the token embedding: its own matrix, trained by AdamW"
KIND = "model"


def change(cfg):
    cfg.untied_head = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Speedrun, stage 6: a learned embedding of each (previous token, token) pair added to the token embedding.

Parent: speedrun_5_wsd. No anchor figure: a speedrun stage is judged against speed_0 in the same run. CHANGES THE
MODEL: a new table (zero at the start, so the first forward is the parent's); the target stays speed_0's final loss.

The blocks must find by attention which pair of characters ends at a position; a table indexed by the pair hands it
to them at the input (modded-nanogpt's bigram hash embedding; nanochat's). The characters' vocabulary is small
enough for a row per pair. Code: gpt/model.py (bigram_index), switched on by gpt/optimizations/ngram_embedding.py.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "a learned bigram embedding (previous token, token) added to the token embedding"
KIND = "model"


def change(cfg):
    cfg.bigram_embedding = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

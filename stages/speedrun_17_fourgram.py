"""Speedrun, stage 17: a learned embedding of each hashed four-gram (token-3 to token), beside the trigram one.

Parent: speedrun_16_muon_momentum. No anchor figure: a speedrun stage is judged against speed_0 in the same run.
CHANGES THE MODEL: a new table (zero at the start, so the first forward is the parent's); the target stays speed_0's
final loss.

What held the parent back: its tokens. After four stages of schedule and rates (speedrun_14 to speedrun_16), eight
more settings swept at speedrun_15 and six at the parent moved the tokens to the target by no more than the seeds
do (docs/speedrun.md, the log of 2026-11-28, evening), while a counting 5-gram model reaches the target on about
80k characters (gpt/ngram_floor.py) and the parent needs ~112k tokens: what the model is handed, not how it is
trained, was the gap. speedrun_10's trigram table took 22-34% fewer tokens; this one hands the blocks the four
characters ending at each position, hashed as the trigram's (gpt/model.py:hashed_ngram_index) into FOURGRAM_ROWS
rows (gpt/optimizations/ngram_embedding.py: the sizes tried). AdamW updates its entries every step, as the
trigram's. Code: gpt/model.py (fourgram_index), switched on by gpt/optimizations/ngram_embedding.py.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "a learned hashed four-gram embedding added beside the trigram one"
KIND = "model"


def change(cfg):
    cfg.fourgram_embedding = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

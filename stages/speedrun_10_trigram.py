"""Speedrun, stage 10: a learned embedding of each hashed (token-2, token-1, token) triple, beside the bigram one.

Parent: speedrun_9_x0_shortcut. No anchor figure: a speedrun stage is judged against speed_0 in the same run. CHANGES
THE MODEL: a new table (zero at the start, so the first forward is the parent's); the target stays speed_0's final
loss.

speedrun_6's bigram table hands the blocks the pair ending at each position; this one hands them the triple, hashed
into 8,192 rows (an exact table would need 525,000), as modded-nanogpt's and nanochat's hashed n-gram embeddings do.
It costs per-step work: AdamW updates its 1,048,576 entries every step (not timed; docs/speedrun.md). Code:
gpt/model.py (trigram_index), switched on by gpt/optimizations/ngram_embedding.py.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "a learned hashed trigram embedding (8,192 rows) added beside the bigram one"
KIND = "model"


def change(cfg):
    cfg.trigram_embedding = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

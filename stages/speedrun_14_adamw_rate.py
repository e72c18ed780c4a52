"""Speedrun, stage 14: AdamW's learning rate doubled, for the parameters Muon does not update.

Parent: speedrun_13_host_memory. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes
the training (not the model): the target stays speed_0's final loss.

What held the parent back: since speedrun_3, Muon updates the blocks' matrices at its own rate, and AdamW the rest (the
token, bigram and trigram embeddings, the gains, the head) at speedrun_2's rate, 4e-3, which was swept when AdamW
trained the whole model and not again since. Swept at this stage on the tuning seeds 3410-3412, x5.66 and x8 against x4
gave 4-6% and 6-10% fewer tokens to the target, x11.3 5-6%; x8 was the best on every seed, and on the reported seeds it
took 5-9% fewer (docs/speedrun.md, the logs of 2026-11-27 and 2026-11-28). A stage kept for its tokens: its seconds
moved within the machine's noise. Muon's rate and every schedule are untouched; min_lr keeps its ratio to lr. Code:
gpt/optimizations/muon.py (which parameters AdamW keeps), gpt/optimizations/schedule.py.
"""

LR_FACTOR = 2.0  # x speedrun_2's AdamW rate (4e-3 -> 8e-3): swept x1.41, x2, x2.83 on the tuning seeds

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = f"AdamW's learning rate x{LR_FACTOR:g} (embeddings, n-gram tables, gains, head; Muon's untouched), swept"
KIND = "training"


def change(cfg):
    cfg.lr *= LR_FACTOR
    cfg.min_lr *= LR_FACTOR


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

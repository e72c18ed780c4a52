"""Speedrun, stage 4: today's small-GPT architecture.

Parent: speedrun_3_muon. No anchor figure: a speedrun stage is judged against speed_0 in the same run. CHANGES THE
MODEL: no equivalence is claimed; the target stays speed_0's final loss, so the question is only whether this model
gets there sooner.

ReLU² in the MLP (So et al. 2021, Primer), RMSNorm (Zhang & Sennrich 2019), QK-norm (Henry et al. 2020; Dehghani
et al. 2023), output projections that start at zero (each block starts as the identity) and rotary position
embeddings (Su et al. 2021, RoFormer) in place of the learned table: the blocks of modded-nanogpt and nanochat.
Code: gpt/model.py, switched on by gpt/optimizations/architecture.py.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "today's small-GPT blocks (ReLU², RMSNorm, QK-norm, zero-init projections, rotary)"
KIND = "model"


def change(cfg):
    cfg.architecture = "modern"


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

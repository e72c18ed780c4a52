"""Speedrun, stage 3: Muon for the hidden matrices.

Parent: speedrun_2_batch_lr. No anchor figure: a speedrun stage is judged against speed_0 in the same run. Changes
the training (not the model): the target stays speed_0's final loss.

Muon (Jordan et al. 2024; torch.optim.Muon since PyTorch 2.9) takes SGD-momentum's update of each 2-D hidden matrix
and orthogonalises it (a few Newton-Schulz iterations), so every direction of the matrix moves at the same rate
instead of the few that dominate the gradient: modded-nanogpt's record log counts it among its largest single gains.
It accepts only matrices: the embeddings (the token embedding is tied to the output head), the norms and the biases
keep AdamW. Its learning rate, momentum and weight decay are set explicitly (its default weight decay is not the
AdamW groups'); on a torch without it the stage is skipped with that reason.
Code: gpt/optimizations/muon.py.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "Muon for the hidden matrices (AdamW for the rest)"
KIND = "training"


def change(cfg):
    cfg.matrix_optimizer = "muon"
    cfg.muon_lr = 0.02
    cfg.muon_momentum = 0.95
    cfg.muon_weight_decay = 0.0


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

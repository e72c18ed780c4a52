"""Memory ladder, stage 1: gradient accumulation x2 (two micro-batches of 16 per step of 32).

Parent: memory_0_baseline. Reference (1x H100): 25194 MiB (-31%), 17.2 s.

Only one micro-batch's activations are alive at a time, so activation memory halves, while the update
is the same: each micro-batch loss is divided by 2 and the gradients add up to the gradient of the batch
of 32. (The reference's own version reset the gradients inside the loop and fed one micro-batch twice, so
it accumulated nothing; tests/optimizations/test_accumulation.py proves this one is exact.)
Code: cfg.grad_accum_steps -> gpt/train.py:train_step (the micro-batch loop).
"""

CHANGE = "gradient accumulation x2"
REFERENCE = {"peak_mib": 25194, "seconds": 17.2}


def change(cfg):
    cfg.grad_accum_steps = 2


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

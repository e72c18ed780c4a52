"""Speed ladder, stage 1: a bigger batch, 8x (reference: 32 -> 256 samples per step).

Parent: speed_0_baseline. Reference (1x H100): 2.28 s per 10240 samples (-70%).

The same N samples take 8x fewer optimizer steps, and each matmul is 8x taller: fixed per-step costs
(kernel launches, Python, the optimizer update) are paid 8x less often and the hardware's parallel units
are better filled. Same data, fewer and larger updates: a change of the training recipe (not of its
per-sample maths), which is why the learning rate is usually revisited with it.
Code: cfg.batch_size -> gpt/train.py:prepare -> gpt/optimizations/feeding.py:make_loader (the DataLoader's batches).
"""

CHANGE = "batch size x8"
REFERENCE = {"seconds": 2.28}


def change(cfg):
    cfg.batch_size *= 8


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

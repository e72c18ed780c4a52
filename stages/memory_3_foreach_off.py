"""Memory ladder, stage 3: AdamW's for-loop implementation (foreach=False).

Parent: memory_2_checkpointing. Reference (1x H100): 13108 MiB (-15%), 23.5 s (+2%).

With activations checkpointed, the optimizer step is now the peak. The multi-tensor (foreach) AdamW
computes each intermediate for all parameters at once, so its temporaries are as large as the whole
model; the for-loop version updates one parameter at a time and its temporaries are one tensor's size.
Slower by the loop's launches, identical in result.
Code: cfg.optimizer_foreach -> gpt/train.py:build_model -> gpt/optimizations/adamw.py:make_optimizer.
"""

CHANGE = "AdamW foreach=False"
REFERENCE = {"peak_mib": 13108, "seconds": 23.5}


def change(cfg):
    cfg.optimizer_foreach = False


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

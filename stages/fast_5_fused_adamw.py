"""Fast ladder (beyond the book), stage 5: fused AdamW (fused=True).

Parent: fast_4_padded_vocab. Anchor (build-nanogpt, GPT-2 124M, one GPU): fused AdamW 93 -> 90 ms per step.

The multi-tensor (foreach) AdamW runs several element-wise kernels over all parameters, each reading and
writing them again. The fused implementation does the whole update of a parameter in one kernel (CUDA,
and a vectorised loop on the CPU), reading each parameter, gradient and moment once. Same update up to
float rounding.
Code: gpt/optimizations/adamw.py:make_optimizer (optimizer_fused).
"""

CHANGE = "fused AdamW"
REFERENCE = {"ms_per_step": 90, "parent_ms_per_step": 93}


def change(cfg):
    cfg.optimizer_fused = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Fast ladder (beyond the book), stage 4: vocabulary padded to a multiple of 64.

Parent: fast_3_sdpa. Anchor (build-nanogpt, GPT-2 124M, one GPU): vocabulary 50257 -> 50304, 96 -> 93 ms
per step.

The output layer is the largest matmul of a small GPT, and 50257 is odd: its tiles do not fit the
kernels' favourite sizes, so the last tile is handled by slower code. 50304 = 786 x 64 rows divide evenly.
The padding rows are never a target, and their logits get a -inf bias, so they have probability 0: the
loss and the gradients of every real row are exactly those of the unpadded model (the padding rows' own
gradients are 0). MFU counts the real vocabulary only: the padding is not model work.
Code: gpt/model.py:GPTConfig.padded_vocab_size and GPT.vocab_mask (vocab_multiple).
"""

CHANGE = "vocabulary padded to a multiple of 64"
REFERENCE = {"ms_per_step": 93, "parent_ms_per_step": 96}


def change(cfg):
    cfg.vocab_multiple = 64


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

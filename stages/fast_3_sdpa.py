"""Fast ladder (beyond the book), stage 3: fused attention (F.scaled_dot_product_attention).

Parent: fast_2_bf16. Anchor (build-nanogpt, GPT-2 124M, one GPU): flash attention 130 -> 96 ms per step.

The explicit attention writes the B x H x T x T score matrix, masks it, softmaxes it, applies dropout
and reads it again for the product with v: four passes over the largest activation of the block, which
is also kept for backward. The fused kernel (FlashAttention on recent GPUs, a fused CPU kernel here)
computes the same softmax block by block in fast memory and never stores the scores; backward recomputes
them. Same maths up to float summation order (and dropout masks drawn differently).
Code: gpt/model.py:CausalSelfAttention.forward (attention="sdpa").
"""
from gpt.stage import stage_main

CHANGE = "fused attention (SDPA)"
REFERENCE = {"ms_per_step": 96, "parent_ms_per_step": 130}


def change(cfg):
    cfg.attention = "sdpa"


if __name__ == "__main__":
    stage_main(__file__)

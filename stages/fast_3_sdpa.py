"""Fast ladder (beyond the book), stage 3: fused attention (F.scaled_dot_product_attention).

Parent: fast_2_bf16. Anchor (build-nanogpt, GPT-2 124M, one GPU): flash attention 130 -> 96 ms per step.

The explicit attention writes the B x H x T x T score matrix, masks it, softmaxes it, applies dropout
and reads it again for the product with v: four passes over the largest activation of the block, which
is also kept for backward. The fused kernel (FlashAttention on recent GPUs, a fused CPU kernel here)
computes the same softmax block by block in fast memory and never stores the scores; backward recomputes
them. Same maths up to float summation order (and dropout masks drawn differently). A run for time on a CPU
uses it only where it was measured faster at the stage's shape, else keeps the explicit attention and its record
says so, with both times (at head size 32 and 64 positions its bf16 backward was 4-5x the explicit one's).
Code: gpt/optimizations/fused_attention.py:fused_attention (attention="sdpa"), called by
gpt/model.py:CausalSelfAttention.forward.
"""

CHANGE = "fused attention (SDPA)"
REFERENCE = {"ms_per_step": 96, "parent_ms_per_step": 130}


def change(cfg):
    cfg.attention = "sdpa"


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

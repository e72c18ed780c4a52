"""Lean ladder (beyond the book), stage 2: chunked linear + cross-entropy.

Parent: lean_1_fsdp_bf16. No anchor figure.

The logits (B*T x vocabulary, plus their fp32 copy for the loss and their gradient) are the largest
activation left after checkpointing when the vocabulary is large: with GPT-2's 50257 tokens at batch 32 and
block 128 they are 785 MiB in fp32. The fused op computes the head and the loss chunk by chunk of rows, so
only one chunk's logits exist at a time. With the reference's 65-character vocabulary the logits are tiny
and this stage saves next to nothing: what it saves grows with vocabulary x tokens per step.
Code: gpt/optimizations/chunked_loss.py:chunked_cross_entropy (loss="chunked"; implementations: see fast_6).
"""

CHANGE = "chunked linear + cross-entropy"
REFERENCE = {}


def change(cfg):
    cfg.loss = "chunked"


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

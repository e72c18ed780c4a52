"""Fast ladder (beyond the book), stage 6: chunked linear + cross-entropy.

Parent: fast_5_fused_adamw. No anchor figure.

With GPT-2's 50257-token vocabulary the logits are the largest tensor of a small model (B*T x 50304), and
the loss passes over them several times (the head's matmul writes them, softmax reads and writes them,
backward writes their gradient). The fused op computes the head, the loss and its gradients chunk by chunk
of rows: each chunk's logits are used while they are in cache and are never stored for backward. Same loss
and gradients up to float summation order; under bf16 the op returns the loss rounded to bf16 (the logged
loss moves by up to ~1%; the gradients carry bf16's rounding, as under autocast). torch.compile leaves the
op eager (a graph break). Four implementations: PyTorch's F.linear_cross_entropy (2.12 and newer),
liger-kernel and Cut Cross-Entropy (Triton, CUDA), and plain PyTorch's chunks (every torch and device); the
record's choices.loss_impl names the one that ran.
With a small vocabulary there is nothing for it to save: a run for time on a CPU uses it only where it was
measured faster than the full loss at the stage's shape, else keeps the full loss and says so (the lean ladder,
a run for memory, keeps it whatever the time).
Code: gpt/optimizations/chunked_loss.py:chunked_cross_entropy (loss="chunked"), called by gpt/model.py:GPT.forward.
"""

CHANGE = "chunked linear + cross-entropy"
REFERENCE = {}


def change(cfg):
    cfg.loss = "chunked"


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Lean ladder (beyond the book), stage 3: FSDP2 CPU offload of parameters, gradients and optimizer state.

Parent: lean_2_chunked_loss. No anchor figure.

The sharded fp32 parameters, their gradients and AdamW's two moments (16 bytes per parameter, divided by
the number of GPUs) move to pinned host memory; each block's shard is copied to the GPU just before its
all-gather, gradients are copied back, and AdamW steps on the CPU. The GPU keeps about one block's gathered
parameters plus the activations, so the largest model that fits is bounded by host RAM instead. The price
is time: every step copies the parameters in and the gradients out over PCIe, and the optimizer runs on
the CPU. Without a GPU there is nothing to offload to: the stage is recorded as skipped.
Code: gpt/optimizations/parallel.py:fsdp_policies (fsdp_cpu_offload).
"""

CHANGE = "FSDP CPU offload"
REFERENCE = {}


def change(cfg):
    cfg.fsdp_cpu_offload = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

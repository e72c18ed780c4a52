"""Memory ladder, stage 2: activation checkpointing of every transformer block.

Parent: memory_1_grad_accum. Reference (1x H100): 15394 MiB (-39%), 23.1 s (+34%).

The forward pass keeps only each block's input; backward recomputes the block's forward to get its
activations back, one block at a time. Activation memory drops from all layers' to about one layer's
plus the block inputs, for roughly one extra forward pass of compute. Dropout's RNG state is restored, so
gradients are identical. Each block is recomputed whole, without PyTorch's early stop, which ends a
recomputation by raising an exception through an op (gpt/optimizations/checkpointing.py:checkpoint_blocks says why).
Code: cfg.activation_checkpointing -> gpt/train.py:build_model -> gpt/optimizations/checkpointing.py:checkpoint_blocks.
"""

CHANGE = "activation checkpointing"
REFERENCE = {"peak_mib": 15394, "seconds": 23.1}


def change(cfg):
    cfg.activation_checkpointing = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

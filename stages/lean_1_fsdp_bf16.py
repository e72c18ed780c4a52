"""Lean ladder (beyond the book), stage 1: FSDP2 mixed precision (bf16 parameters for compute).

Parent: memory_4_fsdp. No anchor figure (torchtitan ships this as an option, not as a measured ladder).

FSDP all-gathers each block's parameters as bf16 copies and the block computes in bf16, so the gathered
parameters and every activation the block keeps for backward take half the bytes. The sharded fp32
parameters remain the master weights that AdamW updates, and gradients are reduce-scattered in fp32
(MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)). Precision changes: the forward and backward
run in bf16, so parameters after a step match fp32 training within bf16's rounding, not exactly.
A CPU computes in bf16 only where its bf16 matmuls were measured faster than fp32 (the speed_5_amp rule);
elsewhere the stage keeps fp32 and its record says "no effect" with the two rates.
Code: gpt/optimizations/parallel.py:fsdp_policies (fsdp_mixed_precision).
"""

CHANGE = "FSDP mixed precision (bf16 compute)"
REFERENCE = {}


def change(cfg):
    cfg.fsdp_mixed_precision = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Speed ladder, stage 5: mixed precision (autocast; fp16 + GradScaler on CUDA, bf16 on the CPU).

Parent: speed_4_compile. Reference (1x H100): 0.73 s per 10240 samples (-33%).

Matmuls run in 16-bit on tensor cores (or the CPU's bf16 units) at several times the fp32 rate and move
half the bytes; softmax, layer norm and the loss stay in fp32. fp16's narrow exponent needs the loss
scaled so small gradients do not flush to zero (GradScaler); bf16 keeps fp32's range and needs no scaler.
On a CPU the rule is measured, not assumed: bf16 autocast if this CPU's bf16 matmuls run faster than its
fp32 ones (the two rates come from gpt/flops.py's cached matmul benchmark and go into the record), else
the stage keeps fp32 and its record says "no effect" with both rates. CPUs differ: one with AMX ran bf16
7x faster than fp32 in this project's runs, one with AVX512-BF16 but no AMX at half the fp32 rate.
The scaler has a cost of its own: GradScaler.step reads its "found inf" flag on the host (`.item()`) every
step to decide whether to skip the update, a device synchronisation inside the timed loop that stalls the
queue of kernels. It is part of what this stage measures. (A fused AdamW, `fused=True`, would read the flag
on the device instead; the ladder keeps the reference's foreach AdamW.)
Code: cfg.amp -> gpt/train.py:train_step -> gpt/optimizations/precision.py:MixedPrecision.autocast (its dtype:
mixed_precision).
"""

CHANGE = "mixed precision (autocast)"
REFERENCE = {"seconds": 0.73}


def change(cfg):
    cfg.amp = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Fast ladder (beyond the book), stage 2: bf16 autocast without a GradScaler, and TF32 matmuls (CUDA).

Parent: fast_1_pretokenized. No anchor figure: build-nanogpt goes fp32 -> TF32 -> bf16 (1000 -> 333 -> 300
ms per step), while this stage replaces fp16 + GradScaler, already on since speed_5_amp.

bf16 has fp32's 8-bit exponent, so gradients do not underflow and the loss needs no scaling: the
GradScaler, its extra passes over the gradients and its per-step host sync (it reads an inf flag on the
host before deciding to step) go away. TF32 runs the fp32 matmuls that autocast leaves in fp32 on tensor
cores. On a CPU this stage changes nothing: the CPU's autocast already is bf16 without a scaler (or fp32
where bf16 is not faster), and TF32 does not exist there; the record says so.
Code: gpt/optimizations/precision.py:mixed_precision and matmul_precision.
"""

CHANGE = "bf16 autocast, no GradScaler; TF32"
REFERENCE = {}


def change(cfg):
    cfg.amp_bf16 = True
    cfg.tf32 = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

"""Speed ladder, stage 6: DistributedDataParallel on 2 processes (NCCL on GPUs, gloo on the CPU).

Parent: speed_5_amp. Reference (2x H100): 0.48 s per 10240 samples (-35%).

Each process holds the whole model and trains on half of the N samples with the same per-process batch;
gradients are averaged across processes by all-reduce, overlapped with the backward pass. The script
starts its processes itself through torchrun (gpt/distributed.py). On the CPU the two processes share the same
cores (one thread each) that one process used before, so expect little gain there.
Code: cfg.distributed -> gpt/train.py:build_model -> gpt/optimizations/parallel.py:parallelize (DDP).
"""

CHANGE = "DDP on 2 processes"
REFERENCE = {"seconds": 0.48}


def change(cfg):
    cfg.distributed = "ddp"
    cfg.nproc = 2


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

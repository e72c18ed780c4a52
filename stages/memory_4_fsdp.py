"""Memory ladder, stage 4: fully sharded data parallel (FSDP2) on 2 processes.

Parent: memory_3_foreach_off. Reference (2x H100): 8502 MiB (-35%), 17.1 s (-27%).

Each process keeps half of every parameter, gradient and optimizer state (ZeRO-3). A block's parameters
are all-gathered just before its forward and its backward and freed after; gradients are reduce-scattered.
Each process trains on half of the N samples, so the ladder's time also halves where there are 2 devices.
The sharding settings are code, in parallelize; the script starts its processes itself through torchrun
(gpt/distributed.py).
Code: cfg.distributed -> gpt/train.py:build_model -> gpt/optimizations/parallel.py:parallelize (fully_shard).
"""

CHANGE = "FSDP on 2 processes"
REFERENCE = {"peak_mib": 8502, "seconds": 17.1}


def change(cfg):
    cfg.distributed = "fsdp"
    cfg.nproc = 2


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

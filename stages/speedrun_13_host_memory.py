"""Speedrun, stage 13: freed host memory kept for reuse, so an eager CPU step stops faulting in fresh pages.

Parent: speedrun_12_eager. No anchor figure: a speedrun stage is judged against speed_0 in the same run. A systems
change (the same arithmetic, bit for bit): the target stays speed_0's final loss.

What held the parent back: running eager, each step allocates and frees its activations, and glibc hands every block
over its mmap threshold back to the kernel when it is freed, so the next step's block is fresh pages, zeroed on first
touch: about 10,000 minor page faults a step, measured at this shape on a 2-core EPYC (33-77 with this change). PyTorch
has a caching allocator for CUDA and none for the CPU; mallopt gives glibc's heap that role for blocks of every size.
Code: gpt/optimizations/host_memory.py.
"""

REFERENCE = {}  # no anchor: judged against speed_0 in the same run
CHANGE = "freed host memory kept for reuse (glibc's mallopt): no page faults for each step's new tensors"
KIND = "systems"


def change(cfg):
    cfg.keep_host_memory = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

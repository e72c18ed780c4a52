"""Speed ladder, stage 2: DataLoader worker processes (num_workers 0 -> 4).

Parent: speed_1_batch_size. Reference (1x H100): 1.87 s per 10240 samples (-18%).

The per-sample text cleaning and tokenisation moves into 4 worker processes that prepare the next
batches while the model trains, instead of running between steps. It helps when the CPU has cores to
spare; on a machine whose cores already run the training itself (a CPU-only run), workers compete with
it. Batches are identical to num_workers=0 (tests/optimizations/test_feeding.py).
Code: cfg.num_workers -> gpt/train.py:prepare -> gpt/optimizations/feeding.py:make_loader (the DataLoader's workers).
"""

CHANGE = "DataLoader num_workers 0 -> 4"
REFERENCE = {"seconds": 1.87}


def change(cfg):
    cfg.num_workers = 4


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

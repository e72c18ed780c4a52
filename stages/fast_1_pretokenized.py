"""Fast ladder (beyond the book), stage 1: pre-tokenised data, each batch gathered in one op on the device.

Parent: speed_5_amp. No anchor figure (build-nanogpt starts from pre-tokenised data).

The documented ladder cleans and tokenises raw text for every sample and then spreads that work over
DataLoader worker processes. Doing it once, offline (data/prepare.py), leaves a file of token ids. This stage
reads it as nanoGPT reads its data, without a DataLoader: the whole token array is put on the training
device once (18 MB as int32 for the Shakespeare corpus) and a batch is one indexing op there,
tokens[starts + arange(block_size + 1)], with the start indices drawn by the same seeded sampler. That
removes the data work instead of moving it: on a small CPU, workers compete with the compute threads for the
same cores; on a GPU, 256 calls of __getitem__, a collate and a copy per step kept the host from queueing
kernels (measured on an H100 before this change, with a DataLoader and no workers: data wait 35% of fast_1's
step). Same maths, same corpus: with the character tokenizer (the reference profile) the batches are the
raw-text pipeline's windows, index by index; with GPT-2's tokenizer a raw-text window starts at a character
and a token window at a token, so the windows differ while their distribution does not.
Code: gpt/data.py:GatheredBatches (batch_gather, dataset="tokens"), gpt/optimizations/feeding.py:make_loader.
"""

CHANGE = "pre-tokenised data, each batch one gather on the device"
REFERENCE = {}


def change(cfg):
    cfg.dataset = "tokens"
    cfg.num_workers = 0
    cfg.batch_gather = True


if __name__ == "__main__":  # run as a script: the command line every stage shares
    from gpt.stage import stage_main

    stage_main(__file__)

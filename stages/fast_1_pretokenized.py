"""Fast ladder (beyond the book), stage 1: pre-tokenised data, read in the training process.

Parent: speed_5_amp. No anchor figure (build-nanogpt starts from pre-tokenised data).

The documented ladder cleans and tokenises raw text for every sample and then spreads that work over
DataLoader worker processes. Doing it once, offline (data/prepare.py), leaves a file of token ids that is
memory-mapped and sliced per sample, as nanoGPT reads its data: a batch costs microseconds, so no workers are
needed. That removes the data work instead of moving it: on a small CPU, workers compete with the compute
threads for the same cores; on a GPU machine, the host is free to queue kernels. Same maths, same corpus:
both datasets are windows of the same cleaned text. With the character tokenizer (the reference profile)
they are the very same windows, index by index; with GPT-2's tokenizer a raw-text window starts at a
character and a token window at a token, so the windows differ while their distribution does not.
Code: gpt/data.py:TokenWindowDataset (dataset="tokens"), gpt/optimizations.py:make_loader.
"""
from gpt.ladder import stage_main

CHANGE = "pre-tokenised memory-mapped data, no workers"
REFERENCE = {}


def change(cfg):
    cfg.dataset = "tokens"
    cfg.num_workers = 0


if __name__ == "__main__":
    stage_main(__file__)

"""Feeding the device (gpt/optimizations/feeding.py) keeps the batches.

DataLoader workers (speed_2) yield the inline loader's batches, pinned memory and non-blocking copies (speed_3) are
asked for on CUDA only, and the pre-tokenised windows (fast_1) are windows of the same text as the per-sample
pipeline's. On the CPU (tests/equivalence.py)."""

import pytest
import torch
from conftest import load_prepare_module
from equivalence import CPU, loader_batches, tiny_config

from gpt.data import WindowSampler, load_prepared, make_dataset
from gpt.optimizations.feeding import make_loader, to_device

# ---- DataLoader workers (speed_2) and pinned memory / non_blocking (speed_3) -----------------------------


@pytest.fixture(scope="module")
def gpt2_text_data(tmp_path_factory, shakespeare_excerpt):
    """The CPU speed profile's kind of data: raw text, cleaned and BPE-tokenised per sample."""
    out = tmp_path_factory.mktemp("equivalence") / "excerpt_gpt2"
    return load_prepare_module().prepare(
        source="files", files=[str(shakespeare_excerpt)], tokenizer="gpt2", out=str(out)
    )


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # 2 cores here
def test_num_workers_4_yields_the_batches_of_num_workers_0(gpt2_text_data):
    """DataLoader workers (num_workers=4) yield the batches of num_workers=0.

    Tolerance 0 (torch.equal): each sample depends only on its index, and the DataLoader hands the workers' batches back
    in sampler order."""
    cfg = dict(dataset="raw_text", block_size=64, batch_size=8)
    inline = loader_batches(tiny_config(gpt2_text_data, num_workers=0, **cfg), steps=6)
    workers = loader_batches(tiny_config(gpt2_text_data, num_workers=4, **cfg), steps=6)
    assert len(inline) == len(workers) == 6
    for (x0, y0), (x4, y4) in zip(inline, workers):
        assert torch.equal(x4, x0) and torch.equal(y4, y0)


class CopySpy:
    """Stands in for a batch tensor: records the arguments of its .to() (a CPU-only build cannot copy to CUDA)."""

    def __init__(self):
        self.calls = []

    def to(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self


def test_pinned_memory_and_non_blocking_copies_are_asked_for_on_cuda_only(char_data):
    """Pinned memory and non-blocking copies (speed_3) are asked for on CUDA only.

    What speed_3 changes, checked without a GPU: its loader pins batches and its copies are non_blocking where the
    device is CUDA, and neither happens on a CPU (no copy to overlap; pinning would only warn). Its mathematics needs no
    check (a copy is a copy): on the CPU the stage runs the same code as its parent, and the pinned copies themselves
    are compared on CUDA in tests/test_gpu.py."""
    pinned, pageable = tiny_config(char_data, pin_memory=True), tiny_config(char_data, pin_memory=False)
    dataset = make_dataset(pinned.dataset, pinned.data_dir, pinned.block_size)
    cuda = torch.device("cuda")  # DataLoader pins only when iterated: building it needs no GPU
    for cfg, device, expected in ((pinned, cuda, True), (pageable, cuda, False), (pinned, CPU, False)):
        assert make_loader(dataset, WindowSampler(len(dataset), 8, 1, 0), cfg, device).pin_memory == expected
        batch = (CopySpy(), CopySpy())
        assert to_device(batch, device, cfg) == batch
        assert [t.calls for t in batch] == [[((device,), {"non_blocking": expected})]] * 2, (cfg.pin_memory, device)


# ---- pre-tokenised data (fast_1) ---------------------------------------------------------------------------


def test_char_token_windows_are_the_raw_text_windows(char_data):
    """With the character tokenizer, the token windows are the raw-text windows.

    Tolerance 0: with the character tokenizer, token i is character i of the cleaned text, so sample i of the
    memory-mapped token file is sample i of the per-sample text pipeline."""
    raw = make_dataset("raw_text", char_data, 32)
    tokens = make_dataset("tokens", char_data, 32)
    for i in torch.randint(min(len(raw), len(tokens)), (200,), generator=torch.Generator().manual_seed(0)).tolist():
        (xr, yr), (xt, yt) = raw[i], tokens[i]
        assert torch.equal(xr, xt) and torch.equal(yr, yt), i


def test_gpt2_token_windows_and_raw_text_windows_come_from_the_same_text(gpt2_text_data):
    """With GPT-2's BPE, token windows and raw-text windows come from the same text.

    With GPT-2's BPE a raw-text window starts at a character and a token window at a token, so they are not the same
    windows; both are windows of the same cleaned text (decoded, each is a piece of it)."""
    prepared = load_prepared(gpt2_text_data)
    text = prepared.text_path("train").read_text()
    raw, tokens = make_dataset("raw_text", gpt2_text_data, 32), make_dataset("tokens", gpt2_text_data, 32)
    decode = prepared.tokenizer.decode
    g = torch.Generator().manual_seed(0)
    for dataset in (raw, tokens):
        for i in torch.randint(len(dataset), (50,), generator=g).tolist():
            x, y = dataset[i]
            assert torch.equal(x[1:], y[:-1])  # next-token targets in both
            # a window may start in the middle of a multi-byte character: drop its first token's text
            assert decode(x[1:].tolist()) in text

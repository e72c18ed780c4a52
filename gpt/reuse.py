"""Results that cannot depend on the machine, computed once and reused while the code behind them is unchanged.

Two of run_all's computations give the same answer on every machine: the memory planner's H100 estimates
(`python -m gpt.memory reference` and `fit`: fake tensors, CUDA's rules, no measurement) and the gradient noise scale
along speed_0's run (a property of the recipe and the data: `python -m gpt.noise_scale`; its step times t(B), which
are the machine's, are measured afresh every time). On 2 CPU cores they are minutes of every run (docs/running.md),
spent reproducing the figures already committed in records/.

So a record of either carries its provenance: the SHA-256 of every source file of this repository that its process had
imported (the stage scripts with them), the torch version, the data it read and its arguments (`key`). run_all reuses
the committed record (records/<profile>-<device>/) when the same files hash the same now and the rest matches, and
says so in its output and in results.md; `./run_all.sh --fresh` computes everything anew. A change that could alter the
result edits one of those files (a new import is an edit too), so a stale record is never reused.
"""

import hashlib
import sys
from datetime import datetime
from pathlib import Path

import torch

from gpt.data import REPO_ROOT
from gpt.devices import cpu_model
from gpt.records import environment, read_record, write_record

STAGES = "stages"  # read or loaded from their files (gpt/ladder.py), never in sys.modules: hashed whole


def source_files() -> list[str]:
    """The repository's source files this process has imported, and every stage script: paths from the repo root."""
    files = {Path(m.__file__) for m in list(sys.modules.values()) if getattr(m, "__file__", None)}
    files = {f.resolve() for f in files if f.is_absolute()} | set((REPO_ROOT / STAGES).glob("*.py"))
    return sorted(
        str(f.relative_to(REPO_ROOT))
        for f in files
        if f.is_relative_to(REPO_ROOT) and ".venv" not in f.parts and f.suffix == ".py" and f.is_file()
    )


def files_sha256(paths: list[str]) -> str | None:
    """One hash over the files' names and contents (None: one of them is gone)."""
    h = hashlib.sha256()
    for rel in paths:
        path = REPO_ROOT / rel
        if not path.is_file():
            return None
        h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
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
        "sha256": files_sha256(files),
        "git_commit": env["git_commit"],
        "computed": env["time"],
        "machine": machine or cpu_model(),
    }


def still_valid(record: dict | None, key: dict) -> bool:
    """The record was computed from the same code (the files it recorded, as they are now), torch and key."""
    prov = (record or {}).get("provenance")
    return (
        bool(prov)
        and prov.get("key") == key
        and prov.get("torch") == torch.__version__
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
        f"on the machine, and the code behind {obj} is unchanged (gpt/reuse.py; `./run_all.sh --fresh` recomputes "
        f"{obj})"
    )


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
    record = {
        **record,
        "reused_from": str(source.relative_to(REPO_ROOT) if source.is_relative_to(REPO_ROOT) else source),
    }
    if dest is not None:
        write_record(Path(dest), record)
    print(f"reused {source}: {reused_note(record)}", flush=True)
    return record

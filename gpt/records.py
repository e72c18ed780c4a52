"""JSON run records: one file per stage run, written atomically so an interrupted ladder loses nothing that finished.

The schema: docs/records.md#the-json-record.
"""

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import torch

from gpt.errors import UserError
from gpt.files import write_atomically
from gpt.loss_curve import baseline_model_loss
from gpt.settings_profiles import SPEEDRUN, profile_settings, speedrun_task_is_time_to_loss

SCHEMA_VERSION = 1
REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """HEAD's hash, with '-dirty' when the work tree has uncommitted changes to tracked files."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        return head + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict:
    """Library versions and the moment, for the record's provenance."""
    import numpy

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "git_commit": git_commit(),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_record(path: Path, record: dict) -> Path:
    """Atomically: a reader sees the old record or the new one, never half of one."""
    return write_atomically(path, json.dumps(record, indent=1, default=str) + "\n")


def append_run(path: Path, entry: dict) -> Path:
    """Add `entry` to the `runs` list of the record at `path`: a history of timings (a test suite's, a first run's)."""
    return write_record(path, {"runs": [*(read_record(path) or {}).get("runs", []), entry]})


def read_record(path: Path) -> dict | None:
    """The record at `path`, or None if there is none or it is not a JSON object (one warning)."""
    path = Path(path)
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        record = None
    if not isinstance(record, dict):
        print(f"warning: unreadable, will rerun: {path}", file=sys.stderr)
        return None
    return record


def writable_dir(path: Path) -> Path:
    """Create `path` if needed and check a record can be written in it (one line, before training)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"the output directory {path} is a file")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UserError(f"cannot write to the output directory {path}: {e.strerror or e}") from None
    return path


def failure_of(e: BaseException) -> dict:
    """The status and reason a record gives for an exception: its first line."""
    if isinstance(e, torch.OutOfMemoryError):
        return {"status": "oom", "reason": str(e).splitlines()[0]}
    return {"status": "failed", "reason": f"{type(e).__name__}: {e}".splitlines()[0]}


def ran_eager(record: dict | None) -> bool:
    """Whether a finished stage with torch.compile on called no compiled graph in its profiled step (unknown: False)."""
    if not record or record.get("status") != "ok" or not record["choices"].get("compile_mode"):
        return False
    return (record["metrics"].get("profiler") or {}).get("compiled_regions_per_step") == 0


def peak_memory_pair(new: dict, old: dict) -> tuple[float | None, float | None, str]:
    """Two finished records' peak memory (MiB), measured the same way, and on what basis.

    'same': the same method; 'reserved', when the methods differ (a CUDA-graph stage after an eager one): both
    records' max_memory_reserved, which every CUDA record carries; 'none' (None, None): no common figure."""
    methods = [_memory_method(r) for r in (new, old)]
    if methods[0] == methods[1]:
        return new["metrics"]["peak_memory_mib"], old["metrics"]["peak_memory_mib"], "same"
    reserved = [r["metrics"].get("peak_memory_reserved_mib") for r in (new, old)]
    if None not in reserved:
        return *reserved, "reserved"
    return None, None, "none"


# Records written before the methods had names described them in words.
_MEMORY_METHODS_IN_WORDS = {"MemTracker": "memtracker", "torch.cuda.max_memory_allocated": "cuda_max_allocated"}


def _memory_method(record: dict) -> str | None:
    method = record.get("choices", {}).get("memory_method") or ""
    return next((name for words, name in _MEMORY_METHODS_IN_WORDS.items() if method.startswith(words)), method)


# ---- where a stage's files go in its run directory -----------------------------------------------------------


TIME_TO_LOSS_DIR = "time_to_loss"  # a run directory's records of stages trained to a loss (gpt/time_to_loss.py)


def record_path(out: Path, stage: str, seed: int | None = None) -> Path:
    """A stage's record; with `seed`, the record of a run with another seed than its profile's."""
    return Path(out) / (f"{stage}.json" if seed is None else f"{stage}.seed{seed}.json")


def other_seed(seed: int | None, profile: str) -> int | None:
    """The seed a run to a loss is named by (its record's file, its W&B run): None for its profile's own."""
    return None if seed is None or seed == profile_settings(profile, "time_to_loss")["seed"] else seed


def time_to_loss_dir(out: Path, ladder: str | None = None) -> Path:
    """Records of runs to a loss: <out>/time_to_loss/, or <out>/<ladder>/ for a ladder that only trains to a loss."""
    return Path(out) / (ladder or TIME_TO_LOSS_DIR)


def speedrun_baseline_dir(out: Path, profile: str) -> Path:
    """Where a run directory of `profile` keeps speed_0's seeds on the speedrun's task, those that set its target.

    <out>/time_to_loss/ where the profile's time to loss is that task (cpu, smoke), else <out>/speedrun/ (reference)."""
    return time_to_loss_dir(out, None if speedrun_task_is_time_to_loss(profile) else SPEEDRUN)


def speedrun_target(out: Path, profile: str) -> float | None:
    """The speedrun's target in a run directory of `profile` (loss_curve.baseline_model_loss); None before all seeds."""
    folder = speedrun_baseline_dir(out, profile)
    paths = [folder / "speed_0_baseline.json", *sorted(folder.glob("speed_0_baseline.seed*.json"))]
    return baseline_model_loss([read_record(p) for p in paths if p.exists()])


def snapshot_path(out: Path, stage: str) -> Path:
    """The CUDA allocator's snapshot of the stage's instrumented step (pytorch.org/memory_viz opens it)."""
    return Path(out) / f"{stage}.memory.pickle"


def trace_path(out: Path, stage: str) -> Path:
    """The profiler's trace of the stage (gzipped Chrome trace JSON: Perfetto, chrome://tracing)."""
    return Path(out) / f"{stage}.trace.json.gz"

"""JSON run records: one file per stage run, written atomically so an interrupted ladder loses nothing
that finished. The schema is documented in README.md ("The JSON record")."""
import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

SCHEMA_VERSION = 1
REPO = Path(__file__).resolve().parent.parent


def git_commit() -> str:
    """HEAD's hash, with '-dirty' when the work tree has uncommitted changes to tracked files."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
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
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def write_record(path: Path, record: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
    os.replace(tmp, path)  # atomic: a reader sees the old record or the new one, never half of one
    return path


def read_record(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


# The keys every record has, and those of a finished ("ok") run; README.md documents their meaning.
RECORD_KEYS = {"stage", "ladder", "profile", "parent", "status", "config", "env"}
OK_KEYS = {"model", "device", "choices", "metrics"}
METRIC_KEYS = {
    "seconds_mean", "seconds_std", "seconds_per_repeat", "samples_per_repeat", "steps_per_repeat",
    "tokens_per_s", "step_time_s", "step_times_s", "first_step_s", "warmup_s", "compile_s", "data_wait_pct",
    "peak_memory_mib", "memory_breakdown_mib", "memory_timeline_mib", "flops_per_token",
    "copy_pct", "time_breakdown_pct", "profiler",
    "peak_flops_per_device", "peak_flops_source", "mfu_pct", "loss_first", "loss_final", "losses",
}
STATUSES = {"ok", "oom", "failed", "skipped"}


def record_problems(record: dict) -> list[str]:
    """What is missing or malformed in a record (an empty list for a valid one)."""
    problems = [f"missing key {k!r}" for k in sorted(RECORD_KEYS - set(record))]
    status = record.get("status")
    if status not in STATUSES:
        problems.append(f"status {status!r} is not one of {sorted(STATUSES)}")
    if status == "ok":
        problems += [f"missing key {k!r}" for k in sorted(OK_KEYS - set(record))]
        metrics = record.get("metrics", {})
        problems += [f"missing metric {k!r}" for k in sorted(METRIC_KEYS - set(metrics))]
        if not metrics.get("seconds_mean", 0) > 0:
            problems.append("seconds_mean must be positive")
        shares = metrics.get("time_breakdown_pct")
        if shares is not None and (abs(sum(shares.values()) - 100) > 1e-6 or min(shares.values()) < 0):
            problems.append(f"time_breakdown_pct must be shares adding up to 100, got {shares}")
    elif not record.get("reason"):
        problems.append(f"a {status!r} record needs a reason")
    return problems

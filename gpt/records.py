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

"""Files written whole or not at all: write aside, then rename over the target.

A reader (or a crash, a Ctrl-C, a full disk) sees the old file or the new one; everything this project writes for later
goes through `write_atomically`.
"""

import os
from pathlib import Path


def write_atomically(path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path`, creating its directory; atomic on one filesystem."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: writers never share one
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path

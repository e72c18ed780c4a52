"""What this machine measured about itself, kept between runs: the CPU's matmul peaks, the faster attention and loss.

Every stage of a ladder then reads the same figure. One JSON file each in $XDG_CACHE_HOME/gpt-ladder, keyed by this
machine (CPU model, threads, torch version) and what the caller names; a read-only home only costs a measurement.
"""

import json
import os
from pathlib import Path

import torch

from gpt.devices import cpu_model
from gpt.files import write_atomically


def cache_file(name: str) -> Path:
    """Where the figures called `name` are kept (read at every call: the tests point XDG_CACHE_HOME elsewhere)."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpt-ladder" / f"{name}.json"


def read(name: str) -> dict:
    try:
        return json.loads(cache_file(name).read_text())
    except (OSError, ValueError):
        return {}


def remembered(name: str, what: str, measure, fresh: bool = False):
    """The figure `what` of file `name` here, measured by `measure()` the first time (or if `fresh`), then kept."""
    key = f"{cpu_model()}|threads={torch.get_num_threads()}|torch={torch.__version__}|{what}"
    if not fresh and key in (cached := read(name)):
        return cached[key]
    value = measure()
    cache = read(name)  # another process may have written meanwhile
    cache[key] = value
    try:
        write_atomically(cache_file(name), json.dumps(cache, indent=1))
    except OSError:
        pass
    return value


def forget(name: str) -> None:
    """Drop every figure of file `name`: the next stage that needs one measures it (run_all does so at its start)."""
    cache_file(name).unlink(missing_ok=True)

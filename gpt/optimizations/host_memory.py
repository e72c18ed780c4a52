"""Freed host memory kept for reuse (speedrun): a CPU run's tensors come back from the C allocator without page faults.

glibc serves every block above its mmap threshold with a fresh mmap and unmaps it when freed, so an eager step that
allocates and frees the same activations faults in new zeroed pages each time. A CUDA run has its own caching
allocator; this is the CPU's missing one, set with mallopt for the whole process: every block comes from a heap that
is never trimmed, none from mmap (the threshold alone stops at 32 MiB, glibc's largest, and speedrun_17's four-gram
gradient is a 32 MiB block). The arithmetic is untouched. Measured: docs/design.md#the-figures-behind-the-rules.
"""

import ctypes
import ctypes.util
import functools

import torch

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization, check_flag

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest: HEAP_MAX_SIZE / 2 on 64-bit; blocks of it and over need M_MMAP_MAX
NO_MMAP = 0  # M_MMAP_MAX: how many blocks may be mmapped at once; none, so a 32 MiB block is the heap's too
NEVER_TRIM = 2**31 - 1  # the heap's free top is never given back to the OS


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None (musl, macOS, Windows: no mallopt with these parameters)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def keep_freed_host_memory(cfg: TrainConfig, device: torch.device) -> str | None:
    """Set glibc to keep freed blocks for reuse, for the rest of the process, where the run asks and it can.

    Returns what the C allocator now does with freed blocks, for the record (None: as the C library does by default)."""
    if not cfg.keep_host_memory or _why_not(cfg, device):
        return None
    libc = _glibc()
    settings = ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_MMAP_MAX, NO_MMAP), (M_TRIM_THRESHOLD, NEVER_TRIM))
    if not all(libc.mallopt(parameter, value) for parameter, value in settings):
        raise OSError("mallopt refused glibc's documented parameters")
    return "glibc keeps every freed block in its never-trimmed heap, none mmapped (mallopt)"


def _why_not(cfg: TrainConfig, device: torch.device) -> str | None:
    if device.type != "cpu":
        return "the step's tensors live in CUDA's caching allocator, which already keeps freed blocks"
    if _glibc() is None:
        return "this C library is not glibc: no mallopt to keep freed blocks"
    return None


HOST_MEMORY = Optimization(
    name="freed host memory kept for reuse",
    fields=("keep_host_memory",),
    code="gpt/optimizations/host_memory.py:keep_freed_host_memory (called by gpt/train.py:prepare)",
    time_targets=("forward", "backward", "optimizer"),
    checks=lambda cfg: check_flag(cfg, "keep_host_memory"),
    no_effect=_why_not,
)

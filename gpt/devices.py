"""Which device a run uses, what it is called, and waiting for it before a clock is read."""

import os
import platform
import re
from pathlib import Path

import torch

from gpt.errors import UserError


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present. Under torchrun each rank takes the GPU of its LOCAL_RANK."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise UserError("--device cuda was asked for but this PyTorch build sees no CUDA GPU")
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    if name == "cpu":
        return torch.device("cpu")
    raise UserError(f"unknown device {name!r} (choose auto, cpu or cuda)")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or cpu_model() or "cpu"


def device_label(device: torch.device) -> str:
    """How a run's sentences name the device a choice was measured on: "CPU", or "GPU (<its name>)"."""
    return f"GPU ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "CPU"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def cpu_kind(cpuinfo: str | None = None) -> str:
    """This CPU as the records name it: its model and the matrix units the speedrun's choices turn on.

    "AMD EPYC with AVX512-BF16", "... with AMX", "... with AVX-512", "... without AVX-512" (`cpuinfo`: /proc/cpuinfo's
    text, read where not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = set(m[1].split()) if (m := re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)) else set()
    name = " ".join(model[1].split()) if model else platform.machine()
    if "amx_tile" in flags:
        return f"{name} with AMX"
    if "avx512_bf16" in flags:
        return f"{name} with AVX512-BF16"
    return f"{name} with AVX-512" if "avx512f" in flags else f"{name} without AVX-512"


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before reading a clock (CPU ops are synchronous: nothing to wait for)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_type(name: str) -> str:
    """'cpu' or 'cuda' for a --device choice ('auto': CUDA when there is a GPU)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name

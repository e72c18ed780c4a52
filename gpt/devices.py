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
    """This CPU as the records name it: its model, the matrix units the speedrun's choices turn on, its generation.

    "AMD EPYC with AVX512-BF16 (family 26, model 2)": "with AMX", "with AVX512-BF16", "with AVX-512" or "without
    AVX-512", then x86's family and model where /proc/cpuinfo gives them, since one model name and one set of units
    spans generations whose speeds differ (`cpuinfo`: /proc/cpuinfo's text, read where not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = set(m[1].split()) if (m := re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)) else set()
    name = " ".join(model[1].split()) if model else platform.machine()
    if "amx_tile" in flags:
        units = "with AMX"
    elif "avx512_bf16" in flags:
        units = "with AVX512-BF16"
    else:
        units = "with AVX-512" if "avx512f" in flags else "without AVX-512"
    family = re.search(r"^cpu family\s*:\s*(\d+)$", cpuinfo, re.M)
    number = re.search(r"^model\s*:\s*(\d+)$", cpuinfo, re.M)
    generation = f" (family {family[1]}, model {number[1]})" if family and number else ""
    return f"{name} {units}{generation}"


def same_cpu_kind(a: str | None, b: str | None, *, strict: bool = False) -> bool:
    """Whether two records' `cpu` (cpu_kind) name one kind of CPU, so that their seconds compare.

    Records made before cpu_kind gave the generation name only the model and units: those match any generation of
    them, unless `strict`, which asks for the same generation named on both."""
    if a is None or b is None:
        return False
    if a == b:
        return not strict or " (family " in a
    return not strict and (a.startswith(b + " (family ") or b.startswith(a + " (family "))


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work before reading a clock (CPU ops are synchronous: nothing to wait for)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_type(name: str) -> str:
    """'cpu' or 'cuda' for a --device choice ('auto': CUDA when there is a GPU)."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name

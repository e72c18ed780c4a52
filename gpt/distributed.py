"""Process groups for the DDP and FSDP stages: launching through torchrun, joining, leaving cleanly."""
import os
import subprocess
import sys

import torch
import torch.distributed as dist


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def why_cannot_run(nproc: int, device_type: str) -> str | None:
    """None if `nproc` processes can run on this device type, else the reason (for a 'skipped' record)."""
    if device_type == "cuda":
        found = torch.cuda.device_count()
        if found < nproc:
            return f"needs {nproc} GPUs, found {found}"
        if not dist.is_nccl_available():
            return "this PyTorch build has no NCCL"
        return None
    if not dist.is_gloo_available():
        return "this PyTorch build has no gloo backend"
    return None


def backend_for(device: torch.device) -> str:
    """NCCL talks GPU to GPU; gloo is the CPU backend."""
    return "nccl" if device.type == "cuda" else "gloo"


def init(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")


def shutdown() -> None:
    """Leave together: without the barrier a rank that finishes first can tear down the group while the
    other is still in a collective, and one run in a few then aborts at exit."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def launch(nproc: int, argv: list[str]) -> int:
    """Re-run this very command as `nproc` processes under torchrun (single node, rendezvous on a free
    local port), so a distributed stage is started with the same command as any other stage."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *argv]
    print(f"launching {nproc} processes: torchrun --standalone --nproc_per_node={nproc} {' '.join(argv)}",
          file=sys.stderr, flush=True)
    return subprocess.run(cmd).returncode

"""The process group a distributed stage builds (gpt/distributed.py): its backends, and how it is left."""

import os
from datetime import timedelta
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import free_port

from gpt import distributed
from gpt.config import TrainConfig
from gpt.ladder import stage_config
from gpt.optimizations import parallel


def on_cpu(backend: str) -> str:
    """The same device -> backend map with gloo standing in for NCCL, which this machine does not have.

    Bare "nccl" serves the GPU only ("cuda:gloo"); "cuda:nccl,cpu:gloo" becomes "cuda:gloo,cpu:gloo"."""
    return (backend if ":" in backend else f"cuda:{backend}").replace("nccl", "gloo")


def clip_host_gradients(rank: int, world: int, port: int, backend: str) -> None:
    """One rank: FSDP's offloaded gradients (DTensor shards in host memory), clipped as gpt/train.py does."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    dist.init_process_group(backend, timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (world,))
        p = torch.nn.Parameter(DTensor.from_local(torch.zeros(4), mesh, [Shard(0)]))
        p.grad = DTensor.from_local(torch.full((4,), 3.0), mesh, [Shard(0)])  # whole gradient: 8 threes
        norm = torch.nn.utils.clip_grad_norm_([p], max_norm=1.0)
        assert abs(float(norm.full_tensor() if isinstance(norm, DTensor) else norm) - 3.0 * 8**0.5) < 1e-4
    finally:
        dist.destroy_process_group()


def test_cpu_offload_group_can_clip_gradients_in_host_memory():
    """The CPU offload group can clip gradients in host memory: it needs a CPU backend beside NCCL.

    lean_3 on 2 GPUs: clip_grad_norm_ all-reduces the norm of host gradient shards through the group (a group of "nccl"
    alone: "No backend type associated with device type cpu"). One rank never all-reduces, so only two processes show
    it; gloo stands in for NCCL on this machine."""
    cfg = stage_config("lean_3_cpu_offload", "reference")
    assert cfg.fsdp_cpu_offload
    backend = parallel.backend(cfg, torch.device("cuda", 0))
    mp.start_processes(clip_host_gradients, args=(2, free_port(), on_cpu(backend)), nprocs=2, start_method="spawn")


@pytest.mark.parametrize("backend, config", [("nccl", "cuda:nccl"), ("cuda:nccl,cpu:gloo", "cuda:nccl,cpu:gloo")])
def test_a_failed_rank_aborts_an_nccl_group_whatever_else_it_holds(backend, config, monkeypatch):
    """After a failure, NCCL is aborted rather than drained (distributed.shutdown), whatever else the group holds.

    Also in the combined group of the CPU offload stage, whose dist.get_backend() is the whole "cuda:nccl,cpu:gloo", not
    "nccl"."""
    aborted, destroyed = mock.Mock(), mock.Mock()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)  # what torch answers for such a group
    monkeypatch.setattr(dist, "get_backend_config", lambda group=None: config)
    monkeypatch.setattr(dist.distributed_c10d, "_abort_process_group", aborted)
    monkeypatch.setattr(dist, "destroy_process_group", destroyed)
    distributed.shutdown(ok=False)
    assert aborted.called and not destroyed.called


def test_only_a_gpu_run_with_offloading_adds_gloo():
    assert distributed.backend_for(torch.device("cpu"), host_collectives=True) == "gloo"
    assert distributed.backend_for(torch.device("cuda", 0)) == "nccl"
    fsdp = TrainConfig(distributed="fsdp", nproc=2)
    assert parallel.backend(fsdp, torch.device("cuda", 0)) == "nccl"

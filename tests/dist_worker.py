"""A few training steps through the project's own code, for the equivalence tests (tests/equivalence.py).

`run_steps` is the one training loop of the equivalence tests: the test process calls it for the
single-process runs, and this file is also the torchrun entry point of the DDP / FSDP runs:

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/dist_worker.py \
        --config '{"distributed": "ddp", ...}' --steps 3 --out DIR

Every rank writes DIR/rank<r>.pt: the input batches it trained on, its losses, its RNG state as training
started (dropout draws from it), the loss its model computes (full or chunked) and (rank 0) the gradients of
every step and the final parameters, unsharded (FSDP keeps 1/W of each parameter per rank:
DTensor.full_tensor() gathers them). The config's device is used: "cpu" (gloo) in the default suite, "cuda"
(NCCL, one GPU per rank) in tests/test_gpu.py, which also runs 2 ranks on one GPU over gloo (--one-gpu).
"""

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from gpt import distributed, optimizations
from gpt.config import TrainConfig
from gpt.data import WindowSampler, make_dataset
from gpt.devices import resolve_device
from gpt.optimizations import parallel, precision
from gpt.optimizations.feeding import make_loader, to_device
from gpt.optimizations.precision import mixed_precision
from gpt.train import build_model, train_step


@dataclass
class Run:
    gpt: torch.nn.Module  # the GPT module itself (inside any wrapper)
    model: torch.nn.Module  # what train_step called (checkpointed / DDP / FSDP / compiled)
    optimizer: torch.optim.Optimizer
    rng: torch.Tensor | None = None  # the CPU generator's state as training starts (dropout's masks)
    inputs: list = field(default_factory=list)  # x of every step, as the model received it
    losses: list = field(default_factory=list)


def param_name(name: str) -> str:
    """The plain GPT parameter name, without the prefixes wrappers add."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach().clone()


def full_params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole. A collective under FSDP: all ranks must call it."""
    return {param_name(n): _whole(p) for n, p in module.named_parameters()}


def record_grads(store: list):
    """A run_steps setup: append {name: whole gradient} each time the optimizer is about to step.

    These are the gradients AdamW uses (accumulated, averaged across ranks, clipped); train_step sets them to None
    right after the step, so this is where they can be read."""

    def setup(run):
        def hook(optimizer, args, kwargs):
            store.append({param_name(n): _whole(p.grad) for n, p in run.gpt.named_parameters()})

        run.optimizer.register_step_pre_hook(hook)

    return setup


def summed_reduction(run) -> None:
    """A run_steps setup, the DDP / FSDP tests' negative control: the ranks' gradients summed, not averaged.

    DDP: a communication hook that all-reduces without dividing; FSDP: a reduce-scatter with SUM where FSDP asks for
    AVG; i.e. every gradient W times too large."""
    if isinstance(run.model, torch.nn.parallel.DistributedDataParallel):

        def all_reduce_sum(state, bucket):
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])

        run.model.register_comm_hook(None, all_reduce_sum)
    else:
        from torch.distributed.fsdp._fully_shard import _fsdp_collectives

        sum_only = lambda *args, **kwargs: (None, None, dist.ReduceOp.SUM, dist.ReduceOp.SUM)  # noqa: E731
        _fsdp_collectives._get_gradient_divide_factors = sum_only


def run_steps(cfg: TrainConfig, steps: int, setup=None, amp=None, device: torch.device | None = None) -> Run:
    """`steps` optimizer steps of gpt.train.train_step on the batches WindowSampler gives this rank.

    `setup(run)` is called after the model and optimizer are built (to attach hooks). `amp` replaces the
    config's MixedPrecision (the tests force fp16 + GradScaler, which the CPU does not choose). `device`: the config's
    unless given (every rank on one GPU: --one-gpu)."""
    optimizations.validate(cfg)
    rank, world, device = distributed.rank(), cfg.world_size, device or resolve_device(cfg.device)
    dataset = make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size)
    raw, model, optimizer = build_model(cfg, dataset.vocab_size, device)
    run = Run(raw, model, optimizer, rng=torch.get_rng_state())
    if setup:
        setup(run)
    amp = amp or mixed_precision(cfg, device)
    sampler = WindowSampler(len(dataset), cfg.batch_size, steps, cfg.seed, rank, world)
    model.train()
    for batch in make_loader(dataset, sampler, cfg, device):
        x, y = to_device(batch, device, cfg)
        run.inputs.append(x.clone())
        run.losses.append(train_step(model, optimizer, x, y, cfg, amp).item())
    assert len(run.losses) == steps
    return run


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="TrainConfig fields as JSON")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True, help="directory for rank<r>.pt")
    p.add_argument(
        "--summed-reduction",
        action="store_true",
        help="the negative control: sum the ranks' gradients instead of averaging them",
    )
    p.add_argument(
        "--cpu-bf16",
        action="store_true",
        help="compute in bf16 where the config asks for it, even on a CPU whose bf16 is slower",
    )
    p.add_argument(
        "--one-gpu",
        action="store_true",
        help="every rank on the one GPU cuda:0, over gloo (NCCL wants a GPU of its own per rank)",
    )
    a = p.parse_args(argv)
    cfg = TrainConfig.from_dict(json.loads(a.config))
    if a.cpu_bf16:
        forced = lambda: (True, "forced by the test")  # noqa: E731
        precision.cpu_bf16_is_faster = forced  # the CPU's rule, which autocast and FSDP both follow
    device = torch.device("cuda", 0) if a.one_gpu else resolve_device(cfg.device)
    distributed.init(device, "gloo" if a.one_gpu else parallel.backend(cfg, device))
    try:
        grads = []
        setups = (record_grads(grads), *([summed_reduction] if a.summed_reduction else []))
        run = run_steps(cfg, a.steps, setup=lambda run: [setup(run) for setup in setups], device=device)
        params = full_params(run.gpt)  # collectives: every rank takes part, rank 0 saves
        rank = distributed.rank()
        torch.save(
            {
                "inputs": torch.stack(run.inputs),
                "losses": run.losses,
                "rng": run.rng,
                "model_loss": run.gpt.config.loss,
                "grads": grads if rank == 0 else None,
                "params": params if rank == 0 else None,
            },
            Path(a.out) / f"rank{rank}.pt",
        )
    finally:
        distributed.shutdown()  # barrier first: see gpt/distributed.py


if __name__ == "__main__":
    main()

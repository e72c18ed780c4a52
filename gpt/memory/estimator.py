"""The memory planner's estimator: a stage's peak memory, predicted by running its training code on fake tensors.

It runs the stage's own build_model and train_step, twice, under FakeTensorMode, with a MemTracker over the
second step; for a CUDA target with CUDA's rules applied. How, and what it leaves out:
docs/memory-planner.md#how-an-estimate-is-made.

Usage: `python -m gpt.memory estimate|reference|fit|compare|snapshot --help` (gpt/memory/__main__.py).
"""

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools import mem_tracker

from gpt import optimizations
from gpt.allocator_snapshot import MiB, cuda_block_bytes
from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.memory.recorder import StepRecorder
from gpt.optimizations import chunked_loss, fused_attention, parallel, precision
from gpt.optimizations.optimization import SimulationPlan
from gpt.peak_memory import memory_breakdown
from gpt.timeline_tracker import TimelineMemTracker
from gpt.train import build_model, train_step

TARGET_DEVICES = ("cuda", "cpu")  # whose memory an estimate predicts
# cuBLAS keeps a workspace per thread that runs matmuls (the forward's, the autograd engine's): 32 MiB on Hopper.
CUBLAS_WORKSPACES_MIB = 2 * 32.0
SIM_DEVICE = torch.device("cpu")  # where the fake tensors live, whatever the target


@dataclass
class Estimate:
    peak_mib: float
    breakdown_mib: dict  # parameters, buffers, gradients, optimizer_state, activations, temporaries, other, total
    params: int  # the whole model's, not one rank's shard
    model: object  # its GPTConfig
    world_size: int
    target: str
    seconds: float  # how long the estimate took
    notes: list[str] = field(default_factory=list)
    snapshot: dict | None = None  # the simulated step in torch.cuda.memory._snapshot()'s format, if recorded
    host_mib: float | None = None  # FSDP CPU offload: the largest host memory the offloaded state takes, per rank


def estimate(cfg: TrainConfig, vocab_size: int, target: str = "cuda", adapt=None, record: bool = False) -> Estimate:
    """Peak memory of one process training with `cfg` on `target`.

    adapt(raw, model, optimizer), if given, may modify what build_model returned (the planner emulates the reference's
    code so). record: also keep the simulated step as a CUDA memory snapshot (Estimate.snapshot)."""
    if target not in TARGET_DEVICES:
        raise UserError(f"unknown target {target!r} (choose one of: {', '.join(TARGET_DEVICES)})")
    plan = simulation_plan(cfg, target, vocab_size)
    sim, notes = plan.cfg, plan.notes
    recorder = StepRecorder() if record else None
    tracker = _PeakTracker(recorder, offload=plan.state_on_host)
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if parallel.is_distributed(sim):
            stack.enter_context(_fake_process_group(sim.world_size))
        stack.enter_context(FakeTensorMode())
        if target == "cuda":
            stack.enter_context(_cuda_rules())
        raw, model, optimizer = build_model(sim, vocab_size, SIM_DEVICE)
        if adapt:
            adapt(raw, model, optimizer)
        amp = precision.simulated_precision(sim, target, SIM_DEVICE)

        def step():
            # Fake token batches: the data pipeline only ever puts these two small tensors on the device.
            x, y = (torch.randint(vocab_size, (sim.batch_size, sim.block_size)) for _ in range(2))
            train_step(model, optimizer, x, y, sim, amp)

        step()  # the first step creates AdamW's state
        tracker.track_external(model, optimizer)  # what exists now: parameters, gradients, optimizer state
        stack.enter_context(tracker)
        if recorder:
            recorder.start()
        step()
        if recorder:
            recorder.stop()
    breakdown = memory_breakdown(tracker)
    unseen = optimizations.unseen_memory(cfg, raw, target)
    if target == "cuda":
        unseen.append((CUBLAS_WORKSPACES_MIB, "cuBLAS workspaces (one per thread that runs matmuls)", ""))
    for i, (mib, what, where) in enumerate(unseen):
        _add_other(breakdown, notes, mib, what, where)
        if recorder:
            recorder.hold(("unseen", i), int(mib * MiB))
    host = round(tracker.host_peak / MiB, 2) if plan.state_on_host else None
    return Estimate(
        peak_mib=breakdown["total"],
        breakdown_mib=breakdown,
        params=raw.num_params(),
        model=raw.config,
        world_size=cfg.world_size,
        target=target,
        seconds=time.perf_counter() - t0,
        notes=notes,
        snapshot=recorder.snapshot() if recorder else None,
        host_mib=host,
    )


def _add_other(breakdown: dict, notes: list[str], mib: float, what: str, where: str = "") -> None:
    """Memory the simulation does not see, added to the breakdown's 'other' (and total), with a note."""
    breakdown["other"] = round(breakdown["other"] + mib, 2)
    breakdown["total"] = round(breakdown["total"] + mib, 2)
    notes.append(f"{what} ({mib:,.1f} MiB, in 'other') added{where}")


def simulation_plan(cfg: TrainConfig, target: str, vocab_size: int) -> SimulationPlan:
    """What the simulation runs: the stage's settings on the CPU, one step of samples, its optimizations rewritten.

    Each optimization is rewritten as it declares (gpt/optimizations: eager, in-process data, one DDP rank, PyTorch's
    chunked loss, ...)."""
    sim = dataclasses.replace(cfg, device="cpu", samples=cfg.batch_size * cfg.world_size)
    plan = optimizations.plan_simulation(SimulationPlan(sim, target, source=cfg, vocab_size=vocab_size))
    optimizations.validate(plan.cfg)
    return plan


_PARAM, _GRAD, _OPT = mem_tracker._MemRefType.PARAM, mem_tracker._MemRefType.GRAD, mem_tracker._MemRefType.OPT


class _PeakTracker(TimelineMemTracker):
    """TimelineMemTracker whose peak, under FSDP CPU offload, is of what stays on the GPU.

    It also keeps the host's peak. With a recorder, it also reports every storage that appears, grows, shrinks or goes
    (gpt/memory/recorder.py)."""

    def __init__(self, recorder: StepRecorder | None = None, offload: bool = False):
        super().__init__()
        self.recorder = recorder
        self.offload = offload  # FSDP CPU offload: the peak is of what stays on the GPU (see _host_bytes)
        self.host_peak = 0
        self._sharded_params = {}

    def _update_snap(self, u_type, winfo, old_mem_consumed=None, old_reftype=None):
        super()._update_snap(u_type, winfo, old_mem_consumed, old_reftype)
        r = self.recorder
        if r is None or u_type == mem_tracker._UpdateType.REF:  # REF: only the category changed
            return
        r.clock = len(self.timeline)
        if u_type in (mem_tracker._UpdateType.DEL, mem_tracker._UpdateType.SIZE):
            r.free(id(winfo))  # a resized storage (FSDP's resize_) is a new allocation, as on CUDA
        if u_type in (mem_tracker._UpdateType.ADD, mem_tracker._UpdateType.SIZE):
            r.alloc(id(winfo), winfo.size * winfo.element_size)

    def __enter__(self):
        super().__enter__()  # it starts the peak at everything alive now; restart it by this tracker's rule
        # Between steps FSDP holds only the sharded parameters: those are the ones CPU offload keeps on the host.
        self._sharded_params = {dev: snap.get(_PARAM, 0) for dev, snap in self._curr_mem_snap.items()}
        self._peak_mem, self._peak_mem_snap = {}, {}
        self._update_peak_stats(None)
        return self

    def _host_bytes(self, dev, snap: dict) -> dict:
        """Under CPU offload, the bytes of each category in host memory: the sharded parameters, gradients and state."""
        if not self.offload:
            return {}
        return {
            _PARAM: min(snap.get(_PARAM, 0), self._sharded_params.get(dev, 0)),
            _GRAD: snap.get(_GRAD, 0),
            _OPT: snap.get(_OPT, 0),
        }

    def _update_peak_stats(self, peak_state) -> None:
        for dev, snap in self._curr_mem_snap.items():
            host = self._host_bytes(dev, snap)
            self.host_peak = max(self.host_peak, sum(host.values()))
            on_device = snap[mem_tracker._TOTAL_KEY] - sum(host.values())
            if on_device > self._peak_mem.get(dev, 0):
                self._peak_mem[dev] = on_device
                self._peak_mem_snap[dev] = {
                    **snap,
                    **{k: snap.get(k, 0) - v for k, v in host.items()},
                    mem_tracker._TOTAL_KEY: on_device,
                }


# ---- CUDA's rules, applied to the simulation on fake CPU tensors ------------------------------------------


def _cuda_allocation(winfo) -> int:
    """Stands in for MemTracker's per-storage byte count, which rounds only for tensors on a CUDA device."""
    return cuda_block_bytes(winfo.size * winfo.element_size)


_cpu_dropout = F.dropout


def _cuda_dropout(input, p=0.5, training=True, inplace=False):
    """F.dropout as CUDA runs it: the fused native_dropout, which keeps a 1-byte mask (the CPU's path: 4-byte noise).

    native_dropout has a CPU kernel too, so calling it reproduces CUDA's tensors."""
    if training and 0 < p < 1 and not inplace and input.numel() > 0:  # CUDA's condition for the fused kernel
        return torch.native_dropout(input, p, True)[0]
    return _cpu_dropout(input, p, training, inplace)


_cpu_sdpa = F.scaled_dot_product_attention


def _cuda_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
    """F.scaled_dot_product_attention as an H100 runs it for this model (no mask, head size <= 256).

    The flash kernel for 16-bit inputs, the memory-efficient one for fp32: both keep only the output and a logsumexp
    per row, where the CPU's math path keeps the T x T weights; both have fake-tensor rules, so they run here."""
    if attn_mask is not None or kwargs.get("enable_gqa") or query.size(-1) > 256:
        return _cpu_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, **kwargs)
    if query.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, None, query.requires_grad, dropout_p, is_causal, scale=scale
    )[0]


# Where CUDA's autocast op lists (aten/src/ATen/autocast_mode.cpp; torch.amp's docs: "CUDA Ops that can autocast
# to float32" / "to float16") differ from the CPU's, which the simulation runs under: these ops get float32 inputs
# on CUDA and keep 16-bit ones on the CPU (softmax is the explicit attention's T x T probabilities: 4 bytes an
# element on CUDA), and these get 16-bit inputs on CUDA only. The other ops of both lists agree or are not used.
CUDA_AUTOCAST_FP32_ONLY = (
    "softmax",
    "log_softmax",
    "softmin",
    "layer_norm",
    "group_norm",
    "normalize",
    "pow",
    "exp",
    "expm1",
    "log",
    "log10",
    "log1p",
    "log2",
    "reciprocal",
    "rsqrt",
    "sum",
    "cumsum",
    "cumprod",
    "norm",
    "softplus",
    "acos",
    "asin",
    "cosh",
    "sinh",
    "tan",
    "erfinv",
    "renorm",
    "cosine_similarity",
    "dist",
    "pdist",
)
CUDA_AUTOCAST_16BIT_ONLY = ("addmv", "addr", "mv", "einsum", "chain_matmul")


def _callables(names) -> set:
    """torch.X, F.X and Tensor.X for each name (the ways one op is called from Python)."""
    return {f for n in names for home in (torch, F, torch.Tensor) if (f := getattr(home, n, None)) is not None}


class _CudaAutocastLists(torch.overrides.TorchFunctionMode):
    """The CPU's autocast, made to cast as CUDA's does.

    It sits above autograd, like autocast itself, so the casts and the tensors saved for backward are CUDA's (a float32
    softmax output kept for its backward)."""

    fp32, low = _callables(CUDA_AUTOCAST_FP32_ONLY), _callables(CUDA_AUTOCAST_16BIT_ONLY)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_autocast_enabled("cpu") and (func in self.fp32 or func in self.low):
            to = torch.float32 if func in self.fp32 else torch.get_autocast_dtype("cpu")

            def cast(a):
                return a.to(to) if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dtype != to else a

            args, kwargs = torch.utils._pytree.tree_map(cast, (args, kwargs))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _cuda_rules():
    # Patched for the estimate's duration (nn.Dropout looks F.dropout up at every call, also when activation
    # checkpointing recomputes a block during backward). The simulation runs on the CPU, whose measured rules
    # must not decide what a GPU computes with: FSDP's mixed precision is bf16 on CUDA, and attention is SDPA.
    with (
        mock.patch.object(mem_tracker._WeakRefInfo, "_calculate_mem_consumed", _cuda_allocation),
        mock.patch.object(F, "dropout", _cuda_dropout),
        mock.patch.object(F, "scaled_dot_product_attention", _cuda_sdpa),
        mock.patch.object(parallel, "bf16_is_fast", return_value=(True, "a CUDA GPU")),
        mock.patch.object(fused_attention, "measured_attention_choice", return_value=("sdpa", None)),
        mock.patch.object(chunked_loss, "measured_loss_choice", return_value=("chunked", None)),
        _CudaAutocastLists(),
    ):
        yield


# ---- distributed ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _fake_process_group(world_size: int):
    """This process as rank 0 of `world_size` ranks whose collectives do nothing."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers "fake"

    if dist.is_initialized():
        raise UserError("a process group is already initialised: run the memory estimate in its own process")
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
    try:
        # A device mesh is built from a tensor of rank ids, which FakeTensorMode would make fake (and
        # unreadable). Build the stage's mesh here, outside fake mode, on the simulation's device.
        mesh = parallel.device_mesh(SIM_DEVICE)
        with mock.patch.object(parallel, "device_mesh", return_value=mesh):
            yield
    finally:
        dist.destroy_process_group()

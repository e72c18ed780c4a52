"""Muon (the speedrun ladder): the transformer blocks' weight matrices are updated with Muon, the rest with AdamW.

Muon (Keller Jordan, 2024; torch.optim.Muon) replaces a matrix's momentum update by its nearest semi-orthogonal
matrix (Newton-Schulz iterations), so every direction moves by about as much; it is defined for 2-D hidden matrices
only, so the embeddings, norms and biases keep AdamW, as in the modded-nanogpt speedruns.

torch's Muon orthogonalises one matrix at a time; BatchedMuon (speedrun_18) stacks the matrices of each shape and runs
the same iterations once per shape, one batched product where there were as many small ones as layers.
"""

import contextlib
import math
from collections import ChainMap, defaultdict

import torch
import torch.nn as nn
from torch.optim import _muon

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.adamw import make_optimizer as make_adamw
from gpt.optimizations.optimization import Optimization, check_flag
from gpt.optimizations.precision import bf16_is_fast

OPTIMIZERS = ("adamw", "muon")


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """Muon's parameters: the 2-D weights inside the transformer blocks.

    They are attention's c_attn and c_proj and the MLP's c_fc and c_proj, found through the blocks, not by shape: the
    embeddings are 2-D too, and stay AdamW's."""
    gpt = getattr(model, "module", model)  # DDP wraps the GPT; checkpointing and FSDP keep its attributes
    return [p for p in gpt.transformer.h.parameters() if p.ndim == 2 and p.requires_grad]


class MuonWithAdamW(torch.optim.Optimizer):
    """Muon and AdamW as one optimizer that train_step, GradScaler (unscale_, step) and the schedule treat as any other.

    Its param_groups are the two optimizers' own group dicts (a learning rate set on one of them is the one that steps);
    its state is a view of theirs; step() steps both."""

    def __init__(
        self,
        muon: torch.optim.Optimizer,
        adamw_: torch.optim.Optimizer,
        newton_schulz_dtype: torch.dtype = torch.bfloat16,
    ):
        self.muon, self.adamw = muon, adamw_
        self.newton_schulz_dtype = newton_schulz_dtype
        super().__init__([*muon.param_groups, *adamw_.param_groups], defaults={})  # shares the dicts, adds nothing
        self.state = ChainMap(muon.state, adamw_.state)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with newton_schulz_in(self.newton_schulz_dtype):
            self.muon.step()
        self.adamw.step()
        return loss

    def load_state_dict(self, state_dict):
        raise NotImplementedError("MuonWithAdamW: load each of .muon and .adamw instead")


def learning_rates(optimizer) -> dict[str, float]:
    """The learning rates a curve records: AdamW's as `lr`, Muon's as `muon_lr` where Muon holds the blocks' matrices.

    Muon's groups are told apart by their Newton-Schulz steps (as the schedule does) and come first in MuonWithAdamW's
    list and in PlainMuonAdamW's, so the first group's rate would pass for the run's; AdamW's is the run's `lr`."""
    muon = [g for g in optimizer.param_groups if "ns_steps" in g]
    adamw = [g for g in optimizer.param_groups if "ns_steps" not in g]
    return {"lr": adamw[0]["lr"], "muon_lr": muon[0]["lr"]} if muon else {"lr": adamw[0]["lr"]}


def newton_schulz(
    grads: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """torch's Newton-Schulz iteration on a stack of same-shaped matrices (k, rows, cols) at once, in `dtype`.

    Matrix by matrix it is torch/optim/_muon.py's _zeropower_via_newtonschulz: the same quintic with the same
    coefficients and steps, each matrix normalised by its own norm; torch's runs in bfloat16, hard-coded. Each batched
    product multiplies every matrix of the stack as the unbatched one does (tests/optimizations/test_muon.py: equal
    to the last bit on the CPU)."""
    a, b, c = ns_coefficients
    x = grads.to(dtype)
    tall = x.size(-2) > x.size(-1)
    x = x.mT if tall else x
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    for _ in range(ns_steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def newton_schulz_fp32(
    grad: torch.Tensor, ns_coefficients: tuple[float, float, float], ns_steps: int, eps: float
) -> torch.Tensor:
    """torch's Newton-Schulz iteration on one matrix in float32 instead of its hard-coded bfloat16 (a stack of one)."""
    return newton_schulz(grad[None], ns_coefficients, ns_steps, eps, torch.float32)[0]


# A torch without Muon (before 2.9) still imports this module; it never builds one (MUON.cannot_run says why).
class BatchedMuon(getattr(torch.optim, "Muon", torch.optim.Optimizer)):
    """torch.optim.Muon whose Newton-Schulz iterations run once per shape, on the stacked matrices of that shape.

    The step is torch's _single_tensor_muon (momentum, Nesterov, decoupled weight decay, the lr adjustment) with the
    orthogonalisation moved out of the per-matrix loop: the blocks' 4 shapes make 4 batched iterations where torch
    runs one per matrix (16 for speedrun_17's 4 blocks)."""

    def __init__(self, params, newton_schulz_dtype: torch.dtype = torch.bfloat16, **settings):
        super().__init__(params, **settings)
        self.newton_schulz_dtype = newton_schulz_dtype

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise NotImplementedError("BatchedMuon: no closure (MuonWithAdamW evaluates it)")
        for group in self.param_groups:
            batched_muon_step(group, self.state, self.newton_schulz_dtype)


def batched_muon_step(group: dict, state: dict, newton_schulz_dtype: torch.dtype) -> None:
    """BatchedMuon's step of one parameter group (its dict, as torch's Muon keeps it) with `state` its per-matrix state.

    torch's _single_tensor_muon with the Newton-Schulz iterations run once per shape on the stacked updates."""
    # torch's own _init_group is private and its signature has changed between releases: gathered here
    params = [p for p in group["params"] if p.grad is not None]
    lr, momentum = group["lr"], group["momentum"]
    updates = []
    for p in params:
        matrix_state = state[p]
        if "momentum_buffer" not in matrix_state:  # torch's state key, zero at the first step
            matrix_state["momentum_buffer"] = torch.zeros_like(p.grad)
        buf = matrix_state["momentum_buffer"]
        buf.lerp_(p.grad, 1 - momentum)
        updates.append(p.grad.lerp(buf, momentum) if group["nesterov"] else buf)
    by_shape = defaultdict(list)
    for i, p in enumerate(params):
        by_shape[p.shape].append(i)
    for shape, members in by_shape.items():
        stacked = torch.stack([updates[i] for i in members])
        orthogonal = newton_schulz(
            stacked, group["ns_coefficients"], group["ns_steps"], group["eps"], newton_schulz_dtype
        )
        for i, update in zip(members, orthogonal):
            params[i].mul_(1 - lr * group["weight_decay"])
            params[i].add_(update, alpha=-_muon._adjust_lr(lr, group["adjust_lr_fn"], shape))


@contextlib.contextmanager
def newton_schulz_in(dtype: torch.dtype):
    """Within the context, torch's Muon runs its Newton-Schulz iterations in `dtype` (bf16 as shipped, else float32).

    torch's are bf16, hard-coded; a CPU without bf16 units emulates those tens of times slower than fp32, so there the
    same iterations run in float32 (more precise, not less), swapped in for Muon's step only."""
    if dtype == torch.bfloat16:
        yield
        return
    original = _muon._zeropower_via_newtonschulz
    _muon._zeropower_via_newtonschulz = newton_schulz_fp32
    try:
        yield
    finally:
        _muon._zeropower_via_newtonschulz = original


def newton_schulz_dtype(device_type: str) -> torch.dtype:
    """bf16 where the device multiplies bf16 matrices natively and fast (precision.bf16_is_fast), float32 elsewhere."""
    return torch.bfloat16 if bf16_is_fast(device_type)[0] else torch.float32


def muon_settings(cfg: TrainConfig) -> dict:
    """Muon's settings this project passes explicitly (torch's default weight decay, 0.1, is not this project's)."""
    return dict(lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.muon_weight_decay)


def make_muon(model: nn.Module, cfg: TrainConfig) -> MuonWithAdamW:
    """Muon for the hidden matrices and AdamW for the rest, as one optimizer.

    Muon's settings are passed explicitly (torch's default weight decay, 0.1, is not this project's); AdamW has
    make_optimizer's groups. torch's default lr adjustment keeps the update's RMS alike across rectangular matrices.
    With cfg.muon_batched (speedrun_18) BatchedMuon takes torch's place: the same step, one iteration per shape."""
    hidden = hidden_matrices(model)
    dtype = newton_schulz_dtype(hidden[0].device.type)
    settings = muon_settings(cfg)
    if cfg.muon_batched:
        muon = BatchedMuon(hidden, newton_schulz_dtype=dtype, **settings)  # speedrun_18: one iteration per shape
    else:
        muon = torch.optim.Muon(hidden, **settings)
    return MuonWithAdamW(muon, make_adamw(model, cfg, skip=hidden), dtype)


def _check_optimizer(cfg: TrainConfig) -> None:
    if cfg.matrix_optimizer not in OPTIMIZERS:
        raise UserError(f"unknown matrix_optimizer {cfg.matrix_optimizer!r} (choose {' or '.join(OPTIMIZERS)})")
    if not (math.isfinite(cfg.muon_lr) and cfg.muon_lr > 0):
        raise UserError(f"muon_lr must be a positive number, got {cfg.muon_lr}")
    if not 0 <= cfg.muon_momentum < 1:
        raise UserError(f"muon_momentum must be in [0, 1), got {cfg.muon_momentum}")
    if not cfg.muon_weight_decay >= 0:  # also refuses nan
        raise UserError(f"muon_weight_decay must be >= 0, got {cfg.muon_weight_decay}")
    check_flag(cfg, "muon_batched")
    if cfg.muon_batched and cfg.matrix_optimizer != "muon":
        raise UserError("muon_batched batches Muon's Newton-Schulz iterations: it needs matrix_optimizer='muon'")
    # A settings conflict on every machine, so an error, not a skip: FSDP shards each matrix across the ranks, and
    # Muon's orthogonalisation needs the whole matrix (on a shard it would orthogonalise the wrong thing).
    if cfg.matrix_optimizer == "muon" and cfg.distributed == "fsdp":
        raise UserError("Muon needs whole matrices and FSDP shards them: use DDP or one process with Muon")


def _cannot_run(cfg: TrainConfig, device_type: str) -> str | None:
    if cfg.matrix_optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        return f"Muon needs torch.optim.Muon (PyTorch 2.9 or newer; this is {torch.__version__})"
    return None


MUON = Optimization(
    name="Muon",
    fields=("matrix_optimizer", "muon_lr", "muon_momentum", "muon_weight_decay", "muon_batched"),
    code="gpt/optimizations/muon.py:make_muon",
    time_targets=("optimizer",),
    memory_targets=("optimizer_state",),
    checks=_check_optimizer,
    cannot_run=_cannot_run,
)

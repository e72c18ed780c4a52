"""The speedrun's optimizer outside torch.optim (speedrun): BatchedMuon's and fused AdamW's steps, no Dynamo import.

`torch.optim.Optimizer` imports `torch._dynamo` in an eager run that never compiles: `add_param_group` is wrapped by
`torch._disable_dynamo`, which imports it when the first optimizer is built, and every `step` by
`_use_grad_for_differentiable`, which imports it to call `graph_break()` (torch/optim/optimizer.py, torch 2.13). That
import is about a second of a first run on 2 CPU cores (docs/speedrun.md, the logs of 2026-12-01 and 2026-12-03).
PlainMuonAdamW keeps the two optimizers' parameter groups and state as torch does and steps them with the same
kernels, called directly: BatchedMuon's `batched_muon_step`, and torch's fused AdamW kernel (`torch._fused_adamw_`,
what `AdamW(fused=True)` calls, after the same `_foreach_add_` of the step counts). The arithmetic is untouched:
tests/optimizations/test_plain_optimizer.py checks every parameter to the last bit against MuonWithAdamW.
"""

import inspect
from collections import defaultdict

import torch
import torch.nn as nn

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.optimizations.adamw import parameter_groups
from gpt.optimizations.muon import batched_muon_step, hidden_matrices, muon_settings, newton_schulz_dtype
from gpt.optimizations.optimization import Optimization, check_flag


def defaults_of(optimizer_class) -> dict:
    """An optimizer class's default settings, read from its signature (a group dict's keys), without building one."""
    parameters = inspect.signature(optimizer_class.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}


class PlainMuonAdamW:
    """Muon (batched per shape) on the blocks' matrices and fused AdamW on the rest: MuonWithAdamW without torch.optim.

    What train_step, GradScaler (disabled), the schedule and the curve use of an optimizer: `param_groups` (Muon's
    first, each a dict of torch's own keys, so a rate set on one is the one that steps), `state`, `step()` and
    `zero_grad()`."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], newton_schulz_dtype: torch.dtype):
        self.param_groups = [*muon_groups, *adamw_groups]
        self.state: dict = defaultdict(dict)
        self.newton_schulz_dtype = newton_schulz_dtype

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise NotImplementedError("PlainMuonAdamW: no closure")
        for group in self.param_groups:
            if "ns_steps" in group:
                batched_muon_step(group, self.state, self.newton_schulz_dtype)
            else:
                fused_adamw_step(group, self.state)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none:
            raise NotImplementedError("PlainMuonAdamW: gradients are set to None")
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


def fused_adamw_step(group: dict, state: dict) -> None:
    """torch's fused AdamW step of one group (torch/optim/adam.py:_fused_adam, decoupled decay, no amsgrad/maximize).

    Its state as torch's: the moments zero at the first step, the step count a float32 tensor on the parameter's
    device."""
    tensors = defaultdict(lambda: ([], [], [], [], []))  # by device and dtype, as torch groups them for its kernel
    for p in group["params"]:
        if p.grad is None:
            continue
        s = state[p]
        if not s:
            s["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            s["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            s["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        for into, t in zip(tensors[p.device, p.dtype], (p, p.grad, s["exp_avg"], s["exp_avg_sq"], s["step"])):
            into.append(t)
    beta1, beta2 = group["betas"]
    for params, grads, exp_avgs, exp_avg_sqs, steps in tensors.values():
        torch._foreach_add_(steps, 1)
        torch._fused_adamw_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],  # no amsgrad: no maximum of the second moments
            steps,
            amsgrad=False,
            lr=group["lr"],
            beta1=beta1,
            beta2=beta2,
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            grad_scale=None,
            found_inf=None,
        )


def make_plain_muon_adamw(model: nn.Module, cfg: TrainConfig) -> PlainMuonAdamW:
    """make_muon's optimizer with muon_batched and fused AdamW (the same groups and settings), outside torch.optim."""
    hidden = hidden_matrices(model)
    muon = {**defaults_of(torch.optim.Muon), "params": hidden, **muon_settings(cfg)}
    adamw = defaults_of(torch.optim.AdamW) | {"lr": cfg.lr, "betas": cfg.betas}
    groups = [adamw | group for group in parameter_groups(model, cfg, skip=hidden)]
    return PlainMuonAdamW([muon], groups, newton_schulz_dtype(hidden[0].device.type))


def _check(cfg: TrainConfig) -> None:
    check_flag(cfg, "plain_optimizer")
    if cfg.plain_optimizer and not (cfg.matrix_optimizer == "muon" and cfg.muon_batched and cfg.optimizer_fused):
        raise UserError(
            "plain_optimizer steps batched Muon and fused AdamW: it needs matrix_optimizer='muon', muon_batched and "
            "optimizer_fused"
        )


PLAIN_OPTIMIZER = Optimization(
    name="the optimizer stepped outside torch.optim",
    fields=("plain_optimizer",),
    code="gpt/optimizations/plain_optimizer.py:make_plain_muon_adamw (called by gpt/train.py:build_model)",
    checks=_check,
)

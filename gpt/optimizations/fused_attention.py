"""Fused attention (fast_3): F.scaled_dot_product_attention instead of the explicit B x H x T x T scores.

Both attentions are here; gpt/model.py:CausalSelfAttention.forward calls the one its config names. The fused kernel
never stores the scores but is not faster at every shape (docs/design.md#the-figures-behind-the-rules), so a run for
time computes with SDPA only where it was measured faster at the stage's own shape (`measured_attention_choice`), and
otherwise keeps the explicit attention, with both times as the record's `no_effect`.
"""

import math

import torch
import torch.nn.functional as F

from gpt import machine_cache
from gpt.clocks import race
from gpt.config import TrainConfig
from gpt.devices import device_label, synchronize
from gpt.optimizations.compilation import compile_mode, cuda_graphs_rule
from gpt.optimizations.optimization import Optimization, SimulationPlan
from gpt.optimizations.precision import mixed_precision

ATTENTION_CACHE = "cpu_attention"  # gpt/machine_cache.py's file of measured attention times


def explicit_attention(q, k, v, mask: torch.Tensor, dropout: torch.nn.Module) -> torch.Tensor:
    """softmax(q k^T / sqrt(d), causally masked) v with the B x H x T x T scores materialised.

    This is how the reference model computed it. `mask` is the (T, T) lower triangle of allowed positions."""
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(~mask, float("-inf"))
    return dropout(F.softmax(att, dim=-1)) @ v


def fused_attention(q, k, v, dropout_p: float) -> torch.Tensor:
    """The same attention by PyTorch's fused kernel: the scores are never stored; backward recomputes them."""
    return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)


def attention_used(cfg: TrainConfig, device_type: str) -> tuple[str, str | None]:
    """The attention a stage computes with, and why it is not the one its config asks for (None when it is).

    SDPA except where it was measured slower on this device in a run for time (cfg.goal); under CUDA graphs SDPA by
    rule (attention_how). A run for memory keeps it: it never holds the scores."""
    if not _chosen_by_time(cfg):
        return cfg.attention, None
    if cuda_graphs_rule(cfg, torch.device(device_type), "SDPA"):
        return "sdpa", None
    return measured_attention_choice(cfg, device_type)


def attention_how(cfg: TrainConfig, device_type: str) -> str | None:
    """How the attention was chosen (the record's choices.attention_how).

    "measured", the rule under CUDA graphs (gpt/optimizations/compilation.py:cuda_graphs_rule), or None where the
    config's attention runs unchosen."""
    if not _chosen_by_time(cfg):
        return None
    return cuda_graphs_rule(cfg, torch.device(device_type), "SDPA") or "measured"


def _chosen_by_time(cfg: TrainConfig) -> bool:
    return cfg.attention == "sdpa" and cfg.goal == "time"


def measured_attention_choice(cfg: TrainConfig, device_type: str) -> tuple[str, str | None]:
    """SDPA where it was measured faster on this device than the explicit attention; else the explicit one.

    The measurement is of one forward and backward at the stage's micro-batch, heads, positions, head size, precision,
    dropout and compilation. Measured once per machine (gpt/machine_cache.py)."""
    device = torch.device(device_type)
    shape = cfg.model_shape
    batch, heads, positions = cfg.micro_batch_size, shape["n_head"], cfg.block_size
    head_size = shape["n_embd"] // heads
    dtype = mixed_precision(cfg, device).dtype
    compiled = compile_mode(cfg, device) is not None
    what = f"{batch} x {heads} heads x {positions} positions x {head_size}, {str(dtype).removeprefix('torch.')}" + (
        ", compiled" if compiled else ""
    )
    here = device_label(device)
    explicit_ms, fused_ms = machine_cache.remembered(
        ATTENTION_CACHE,
        f"{what}|dropout={cfg.dropout}" + ("" if device_type == "cpu" else f"|{here}"),
        lambda: time_attentions(batch, heads, positions, head_size, dtype, cfg.dropout, compiled, device),
    )
    if fused_ms <= explicit_ms:
        return "sdpa", None
    return "naive", (
        f"kept the explicit attention: SDPA is slower on this {here} at this shape (forward and "
        f"backward of one layer's attention, {what}: explicit {explicit_ms:.2f} ms, SDPA "
        f"{fused_ms:.2f} ms)"
    )


def time_attentions(
    batch: int,
    heads: int,
    positions: int,
    head_size: int,
    dtype: torch.dtype,
    dropout: float,
    compiled: bool,
    device: torch.device | None = None,
) -> list[float]:
    """Milliseconds of one forward and backward of each attention (explicit, fused) on `device`.

    Each the median of its calls after warm-up, the two timed in turns until their times are apart (gpt/clocks.py:race:
    5 rounds for kernels 2x apart, at most 0.6 s), on real tensors (also under the planner's FakeTensorMode), with
    the random state put back as it was."""
    device = device or torch.device("cpu")
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        mask = torch.ones(positions, positions, dtype=torch.bool, device=device).tril()
        drop = torch.nn.Dropout(dropout)
        explicit = lambda q, k, v: explicit_attention(q, k, v, mask, drop)  # noqa: E731
        fused = lambda q, k, v: fused_attention(q, k, v, dropout)  # noqa: E731
        shape = (batch, heads, positions, head_size)
        steps = [
            _attention_step(torch.compile(fn) if compiled else fn, shape, dtype, device) for fn in (explicit, fused)
        ]
        return race(steps, wait=lambda: synchronize(device))


def _attention_step(fn, shape: tuple, dtype: torch.dtype, device: torch.device, warmup: int = 3):
    """One forward and backward of `fn` on its own q, k, v of `shape`, warmed up `warmup` times: a call to time."""
    q, k, v = (torch.randn(shape, device=device, requires_grad=True) for _ in range(3))

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            y = fn(q, k, v)
        y.float().sum().backward()

    for _ in range(warmup):
        step()
    synchronize(device)
    return step


def _model_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    return {"attention": attention_used(cfg, device_type)[0]}


def _no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    return attention_used(cfg, device.type)[1]


def _simulated_as_run(plan: SimulationPlan) -> None:
    """A CPU estimate computes with the attention the stage's run chose, measured compiled when the stage compiles.

    The planner itself runs eager: compiling speeds up the explicit attention only, so SDPA chosen against the compiled
    one stays chosen against the eager one."""
    if plan.cfg.attention == "sdpa" and plan.target == "cpu":
        plan.cfg.attention = attention_used(plan.source, "cpu")[0]


FUSED_ATTENTION = Optimization(
    name="fused attention (SDPA)",
    fields=("attention",),
    code="gpt/optimizations/fused_attention.py:fused_attention (called by gpt/model.py:CausalSelfAttention.forward)",
    time_targets=("forward", "backward"),
    memory_targets=("activations",),
    model=_model_settings,
    no_effect=_no_effect,
    simulate=_simulated_as_run,
)

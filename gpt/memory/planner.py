"""The planner's three checks: the documented reference ladder, the largest model that fits a budget, and
estimates against this machine's measured runs.

The documented peaks were measured with the reference's code, a modified minGPT. Where that code differs
from this project's in a way that changes memory, the difference is emulated here, on top of this project's
model and training step (gpt/model.py and gpt/train.py stay as they are):
- NewGELU: minGPT writes the tanh GELU as Python ops, 0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3))). Autograd
  then keeps what each op needs for its own backward: besides the input and the output, which F.gelu's
  caller keeps too, the tanh output, 0.5*x and 1+tanh(..), three more tensors 4*n_embd wide per layer.
  The MLP's activation is swapped for it.
- Gradient lifetime: minGPT's trainer calls zero_grad(set_to_none=True) after the forward pass, right before
  backward, where this project's calls it after the optimizer step. So in the reference the previous step's
  gradients stay allocated through the next forward pass, whose end is the peak without checkpointing. (Its
  gradient accumulation zeroes inside the micro-batch loop: the same pattern per micro-batch.)
Its other differences are negligible for memory: an untied lm_head (65 x 1280 more parameters), a float
causal mask buffer, the weight-decay grouping of the embedding.
"""
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import torch
import torch.nn as nn

from gpt.config import TrainConfig
from gpt.errors import UserError
from gpt.ladder import LADDERS, load_stage, stage_config
from gpt.memory import MiB, estimate
from gpt.model import GPT, MLP, GPTConfig

REFERENCE_VOCAB = 65  # character-level tiny Shakespeare
GPT2_VOCAB = 50257
# The documented claim for an 80 GB H100: largest model before and after the memory ladder.
DOCUMENTED_FIT = {"before": 1_795_000_000, "after": 9_183_000_000}


# ---- emulating the reference's code ----------------------------------------------------------------------


class NewGELU(nn.Module):
    """minGPT's GELU (tanh approximation) written as Python ops, as the reference ran it."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def with_newgelu(raw, model, optimizer):
    for m in raw.modules():
        if isinstance(m, MLP):
            m.gelu = NewGELU()


def with_mingpt_gradient_lifetime(raw, model, optimizer):
    """Gradients freed when the forward pass returns (minGPT: zero_grad right before backward) instead of after
    the optimizer step: train_step's own zero_grad becomes a no-op."""
    optimizer.zero_grad = lambda set_to_none=True: None
    model.register_forward_hook(lambda *_: torch.optim.Optimizer.zero_grad(optimizer, set_to_none=True))


def as_reference(raw, model, optimizer):
    with_newgelu(raw, model, optimizer)
    with_mingpt_gradient_lifetime(raw, model, optimizer)


# Columns of `reference`: what each estimate runs. The last one is compared with the documented figures.
VARIANTS = {
    "project": ("this project's model and training step", None),
    "newgelu": ("+ the reference's NewGELU", with_newgelu),
    "reference": ("+ minGPT's gradient lifetime (the reference's code)", as_reference),
}


def reference_config(stage: str, **overrides) -> TrainConfig:
    """A memory stage of the reference profile (gpt2-large, block 128, batch 32, fp32, naive attention,
    dropout 0.1). samples is set to one step: it only matters for timing, and must divide by the batch."""
    cfg = stage_config(stage, "reference", **overrides)
    cfg.samples = cfg.batch_size * cfg.world_size
    return cfg.validate()


class Runner:
    """Runs estimates, in `jobs` worker processes when jobs > 1: an estimate is one single-threaded Python
    loop, so each core can run one. Specs are (config, vocab size, target, variant name)."""

    def __init__(self, jobs: int = 1):
        self.pool = None
        if jobs > 1:  # spawn: fresh processes, no inherited process group or fake mode
            self.pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))

    def map(self, specs: list[tuple]):
        """Estimates in the order of `specs`, each yielded as soon as it and those before it are done."""
        if self.pool is None:
            return map(_estimate_spec, specs)
        return self.pool.map(_estimate_spec, specs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _estimate_spec(spec: tuple):
    cfg, vocab_size, target, variant = spec
    return estimate(cfg, vocab_size, target, adapt=VARIANTS[variant][1])


def reference_ladder(target: str = "cuda", variants=tuple(VARIANTS), vocab_size: int = REFERENCE_VOCAB,
                     runner: Runner | None = None, progress=print) -> list[dict]:
    """Estimates of the reference's five memory stages, in each variant, beside its documented peaks."""
    runner = runner or Runner()
    rows = []
    for stage in LADDERS["memory"]:
        module = load_stage(stage)
        rows.append({"stage": stage, "change": module.CHANGE, "documented_mib": module.REFERENCE["peak_mib"]})
    specs = [(reference_config(row["stage"]), vocab_size, target, name) for row in rows for name in variants]
    jobs = [(row, name) for row in rows for name in variants]
    for (row, name), est in zip(jobs, runner.map(specs)):
        row[name] = est
        progress(f"  {row['stage']} [{name}]: {est.peak_mib:,.0f} MiB ({est.seconds:.1f} s)")
    return rows


def reference_notes(rows: list[dict], vocab_size: int, vocab_checks: list[dict] | None = None) -> list[str]:
    """What the estimates say about the documented peaks, from the estimates themselves. vocab_checks: the
    'reference' variant estimated with GPT-2's vocabulary instead (a hypothesis for the remaining gap)."""
    by = {r["stage"]: r for r in rows}
    s0, s4 = by["memory_0_baseline"], by["memory_4_fsdp"]
    gelu = s0["newgelu"].peak_mib - s0["project"].peak_mib
    grads = s0["reference"].peak_mib - s0["newgelu"].peak_mib
    notes = [
        "Estimates run this project's model and training step under FakeTensorMode on fake CPU tensors, with "
        "CUDA's rules applied (allocations rounded up to 512 bytes; dropout keeps a 1-byte mask as CUDA's "
        "kernel does). 'reference' also emulates the two differences of the reference's code that matter for "
        "memory (gpt/memory/planner.py); its column is the one compared with the documented peaks.",
        f"NewGELU: minGPT's Python-op GELU keeps three more 4*n_embd-wide tensors per layer for backward than "
        f"F.gelu (tanh's output, 0.5*x and 1+tanh; both keep their input and output): +{gelu:,.0f} MiB at "
        f"memory_0 (batch 32, 36 layers).",
        f"Gradient lifetime: minGPT zeroes gradients right before backward, so the previous step's gradients "
        f"are still allocated at the end of the forward pass, the peak without checkpointing: +{grads:,.0f} MiB "
        f"at memory_0.",
    ]
    s2 = by["memory_2_checkpointing"]["reference"].breakdown_mib
    base = reference_config("memory_0_baseline")
    logits = base.batch_size * base.block_size * 4 / MiB  # MiB per vocabulary entry: batch x block floats
    notes.append(
        f"MemTracker counts everything allocated inside optimizer.step() as optimizer state: at memory_2's peak "
        f"(the AdamW step) that is the two moments plus {s2['optimizer_state'] - 2 * s2['parameters']:,.0f} MiB "
        f"of foreach temporaries (a square root of every second moment at once); memory_3's for-loop AdamW "
        f"needs one tensor's worth, so its peak moves back to the forward pass.")
    single = [r for r in rows if r["stage"] != "memory_4_fsdp"]
    gaps = [r["documented_mib"] - r["reference"].peak_mib for r in single]
    acts = [r["reference"].breakdown_mib["activations"] for r in single]
    small = (f"Not modelled, and MiB-sized at vocab {vocab_size}: cuBLAS workspaces; minGPT keeping the previous "
             f"step's logits alive ({logits * vocab_size:,.0f} MiB: batch x block x vocab floats). "
             f"The CUDA context and allocator fragmentation are outside max_memory_allocated.")
    if min(gaps) > 0:
        notes.append(
            f"On one GPU (memory_0..3) the documented peaks exceed the 'reference' estimates by {min(gaps):,.0f} to "
            f"{max(gaps):,.0f} MiB, while the activations at the peak fall from {max(acts):,.0f} to "
            f"{min(acts):,.0f} MiB: the missing memory does not scale with activations but behaves like a fixed "
            f"cost, e.g. more parameters. " + small)
    else:
        notes.append(f"On one GPU (memory_0..3) the documented peaks differ from the 'reference' estimates by "
                     f"{min(gaps):+,.0f} to {max(gaps):+,.0f} MiB. " + small)
    if vocab_checks:
        peaks = " / ".join(f"{r['reference'].peak_mib:,.0f}" for r in vocab_checks)
        errors = " / ".join(f"{100 * (r['reference'].peak_mib / r['documented_mib'] - 1):+.1f}%" for r in vocab_checks)
        n_embd = s0["reference"].model.n_embd
        notes.append(
            f"Hypothesis check, vocabulary: the notes call the model 774M, GPT-2-large's count with GPT-2's "
            f"{GPT2_VOCAB}-token vocabulary ({s0['reference'].params / 1e6:,.1f}M with {vocab_size} characters). "
            f"Estimated with {GPT2_VOCAB} tokens ({vocab_checks[0]['reference'].params / 1e6:,.1f}M), the "
            f"'reference' column becomes {peaks} MiB "
            f"({errors} vs documented). Suggestive, not conclusive: the head is tied here, and minGPT's untied "
            f"head would add {GPT2_VOCAB * n_embd * 16 / MiB:,.0f} MiB on one GPU (its parameters, gradients and "
            f"two moments), and minGPT's retained logits up to {logits * GPT2_VOCAB:,.0f} MiB more.")
    block = _block_params()
    full, one = 4 * s4["reference"].params / MiB, 4 * block / MiB
    doc4, est4 = s4["documented_mib"], s4["reference"].peak_mib
    notes.append(
        f"memory_4 (FSDP, 2 processes): the reference's FSDP settings were never committed. This project "
        f"shards every block (FSDP2), so only one block's parameters ({one:,.0f} MiB) are gathered at a time. "
        f"FSDP wrapping the model as a single unit (no auto-wrap policy) would gather all {full:,.0f} MiB for "
        f"the forward and the backward: +{full - one:,.0f} MiB, {est4 + full - one:,.0f} MiB in all "
        f"({100 * ((est4 + full - one) / doc4 - 1):+.1f}% vs the documented {doc4:,}); a hypothesis, not a "
        f"simulation.")
    return notes


def _block_params() -> int:
    """Parameters of one transformer block of the reference model (built on the meta device: no memory)."""
    with torch.device("meta"):
        model = GPT(GPTConfig.from_preset("gpt2-large", vocab_size=REFERENCE_VOCAB, block_size=128, n_layer=1))
    return sum(p.numel() for p in model.transformer.h[0].parameters())


# ---- the largest model that fits ----------------------------------------------------------------------------

SHAPE_RULE = ("GPT-2-large width (n_embd 1280, 20 heads) with more or fewer layers; the reference setup "
              "otherwise (vocab 65, block 128, batch 32, fp32, naive attention, dropout 0.1)")


def fit_settings(world_sizes=(2, 8), budget_gib: float = 80) -> list[tuple[str, str, int, int | None]]:
    """(label, stage, processes, documented parameters): before the ladder, and after it with FSDP. The
    documented counts are for an 80 GB GPU."""
    documented = DOCUMENTED_FIT if budget_gib == 80 else {}
    rows = [("before: memory_0 settings (1 GPU)", "memory_0_baseline", 1, documented.get("before"))]
    for w in world_sizes:
        rows.append((f"after: memory_3 settings + FSDP ({w} GPUs)", "memory_4_fsdp", w,
                     documented.get("after") if w == 2 else None))
    return rows


VERIFY_MAX_LAYERS = 200  # full-depth fake runs cost ~0.1 s per layer on 1 process, ~0.5 s under FSDP


def largest_fit(stage: str, world_size: int, budget_mib: float, target: str = "cuda", variant: str = "project",
                runner: Runner | None = None, progress=print, verify_max_layers: int = VERIFY_MAX_LAYERS) -> dict:
    """The most layers (at the shape rule's width) whose estimated peak fits `budget_mib`.

    For a fixed width the peak is affine in n_layer: every layer adds the same parameters, gradients,
    optimizer state and saved activations. Two cheap estimates at small depths give the slope; the answer
    is then checked with real estimates at full depth, n fits and n + 1 does not, re-solving along the same
    slope from the deepest estimate until both hold. Beyond `verify_max_layers` a full-depth estimate takes
    minutes (hundreds of sharded layers); there a third estimate at 16 layers checks that the peak is
    affine, and the answer is extrapolated along it (marked `extrapolated`, with the check's residual)."""
    if budget_mib <= 0:
        raise UserError(f"the budget must be positive, got {budget_mib / 1024:g} GiB")
    runner = runner or Runner()
    known = {}

    def peaks(*depths: int) -> list[float]:
        todo = [n for n in dict.fromkeys(depths) if n not in known]
        specs = [(reference_config(stage, n_layer=n, **({"nproc": world_size} if world_size > 1 else {})),
                  REFERENCE_VOCAB, target, variant) for n in todo]
        for n, est in zip(todo, runner.map(specs)):
            known[n] = est
            progress(f"    {n} layers: {est.peak_mib:,.0f} MiB ({est.seconds:.1f} s)")
        return [known[n].peak_mib for n in depths]

    lo, hi = 4, 8
    p_lo, p_hi = peaks(lo, hi)
    slope = (p_hi - p_lo) / (hi - lo)  # MiB per layer
    n = max(1, lo + math.floor((budget_mib - p_lo) / slope))
    if n > verify_max_layers:
        check = 16
        (p_check,) = peaks(check)
        residual = p_check - (p_lo + slope * (check - lo))
        slope = (p_check - p_hi) / (check - hi)
        n = check + math.floor((budget_mib - p_check) / slope)
        per_layer = (known[check].params - known[hi].params) // (check - hi)
        return {"n_layer": n, "params": known[check].params + per_layer * (n - check),
                "peak_mib": p_check + slope * (n - check), "next_peak_mib": p_check + slope * (n + 1 - check),
                "estimates": len(known), "extrapolated": True, "affine_residual_mib": residual}
    for _ in range(5):
        p_n, p_next = peaks(n, n + 1)
        if p_n > budget_mib:
            if n == 1:
                one = known[1]
                state = sum(one.breakdown_mib[k] for k in ("parameters", "gradients", "optimizer_state"))
                raise UserError(
                    f"a budget of {budget_mib / 1024:g} GiB is below what even a 1-layer model needs on {stage} "
                    f"({p_n / 1024:.2f} GiB, of which {state / 1024:.2f} GiB parameters, gradients and "
                    f"optimizer state)")
            n = max(1, n - math.ceil((p_n - budget_mib) / slope))
        elif p_next <= budget_mib:
            n = n + 1 + math.floor((budget_mib - p_next) / slope)
        else:
            return {"n_layer": n, "params": known[n].params, "peak_mib": p_n, "next_peak_mib": p_next,
                    "estimates": len(known), "extrapolated": False}
    raise RuntimeError(f"{stage}: no fit after {len(known)} estimates; the peak is not affine in depth here")


def documented_shapes(rows: list[dict]) -> list[str]:
    """How the documented parameter counts map onto the shape rule, beside what was found."""
    with torch.device("meta"):
        p1, p2 = (GPT(GPTConfig.from_preset("gpt2-large", vocab_size=REFERENCE_VOCAB, block_size=128,
                                            n_layer=n)).num_params() for n in (1, 2))
    per_layer, rest = p2 - p1, p1 - (p2 - p1)
    notes = []
    for r in rows:
        line = f"{r['setting']}: {r['n_layer']} layers, {r['params'] / 1e6:,.0f}M parameters"
        if r["documented_params"]:
            layers = (r["documented_params"] - rest) / per_layer
            line += (f"; documented {r['documented_params'] / 1e6:,.0f}M = {layers:.1f} layers at this width "
                     f"({100 * (r['params'] / r['documented_params'] - 1):+.0f}% here)")
        notes.append(line)
    before = next((r for r in rows if r["world_size"] == 1), None)
    after = next((r for r in rows if r["world_size"] == 2), None)
    if before and after and before["documented_params"]:
        notes.append(
            f"Ratio after/before here: {after['params'] / before['params']:.1f}x (documented "
            f"{DOCUMENTED_FIT['after'] / DOCUMENTED_FIT['before']:.1f}x). The documented 'before' most likely "
            f"used the memory_0 settings on one GPU and 'after' the ladder's last stage, memory_3's settings with "
            f"FSDP on 2 GPUs: the only multi-GPU setting the notes ran.")
    return notes


# ---- against measured runs ------------------------------------------------------------------------------


def compare_records(records: list[dict], runner: Runner | None = None, progress=print) -> list[dict]:
    """Estimate every measured stage record (status ok) with its own configuration and device type."""
    measured = [r for r in records if r.get("status") == "ok" and (r.get("metrics") or {}).get("peak_memory_mib")]
    specs = [(TrainConfig.from_dict(r["config"]), r["model"]["vocab_size"],
              "cuda" if r["device"]["type"] == "cuda" else "cpu", "project") for r in measured]
    rows = []
    for rec, spec, est in zip(measured, specs, (runner or Runner()).map(specs)):
        peak = rec["metrics"]["peak_memory_mib"]
        err = 100 * (est.peak_mib / peak - 1)
        rows.append({"stage": rec["stage"], "measured_mib": round(peak, 2), "estimate_mib": est.peak_mib,
                     "error_pct": round(err, 2), "target": spec[2], "notes": est.notes})
        progress(f"  {rec['stage']}: measured {peak:,.2f} MiB, estimate {est.peak_mib:,.2f} MiB ({err:+.1f}%)")
    return rows

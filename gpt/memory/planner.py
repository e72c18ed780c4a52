"""The planner's three checks: the documented reference ladder, the largest model that fits a budget, measured runs.

The reference's code (a modified minGPT) differs from this project's in three ways that change memory: its NewGELU,
its gradient lifetime and its embedding locals. Each is emulated here, on top of this project's model and training
step (`as_reference`); what they are, and what `reference_figures` mean: gpt/memory/README.md.
"""

import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
import torch.nn as nn

from gpt import allocator_snapshot
from gpt.allocator_snapshot import STACK_CATEGORIES, MiB, cuda_block_bytes
from gpt.config import TrainConfig
from gpt.data import REPO_ROOT
from gpt.errors import UserError
from gpt.ladder import declaration, stage_config, stages_of
from gpt.memory.estimator import estimate
from gpt.model import GPT, MLP, GPTConfig

REFERENCE_VOCAB = 65  # character-level tiny Shakespeare
# The reference's own allocator snapshots of one training step after its warm-up (H100), committed in its repo
# (ailzhang/EfficientPyTorch, chapter_10_mingpt/memory_profiles/). This project keeps them in
# shared/reference/snapshots beside the checkout (or beside a directory above it: git worktrees), not in it.
SNAPSHOTS = {
    "memory_0_baseline": "0_VRAM_Original.pickle",
    "memory_1_grad_accum": "1_VRAM_Gradient_Accumulation.pickle",
}
SNAPSHOT_DIR = next(
    (d for d in (p / "shared" / "reference" / "snapshots" for p in REPO_ROOT.parents) if d.is_dir()), None
)
NOTES = "gpt/memory/README.md"  # what reference_figures mean, figure by figure
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
            m.act = NewGELU()


def with_mingpt_gradient_lifetime(raw, model, optimizer):
    """Gradients freed as the forward pass returns (minGPT's zero_grad before backward; train_step's: a no-op)."""
    optimizer.zero_grad = lambda set_to_none=True: None
    model.register_forward_hook(lambda *_: torch.optim.Optimizer.zero_grad(optimizer, set_to_none=True))


def with_mingpt_embedding_locals(raw, model, optimizer):
    """The embedding lookups' outputs kept until the model's forward returns, as minGPT's locals are."""
    kept = []
    for embedding in (raw.transformer.wte, raw.transformer.wpe):
        embedding.register_forward_hook(lambda module, args, out: kept.append(out))
    raw.register_forward_hook(lambda *_: kept.clear())


def as_reference(raw, model, optimizer):
    with_newgelu(raw, model, optimizer)
    with_mingpt_gradient_lifetime(raw, model, optimizer)
    with_mingpt_embedding_locals(raw, model, optimizer)


# Columns of `reference`: what each estimate runs. The last one is compared with the documented figures.
VARIANTS = {
    "project": ("this project's model and training step", None),
    "newgelu": ("+ the reference's NewGELU", with_newgelu),
    "reference": ("+ minGPT's gradient lifetime and embedding locals (the reference's code)", as_reference),
}


def reference_config(stage: str, processes: int | None = None, **overrides) -> TrainConfig:
    """A memory stage of the reference profile (gpt2-large, block 128, batch 32, fp32, naive attention, dropout 0.1).

    On `processes` processes if it is a DDP/FSDP stage; samples is one step (it only matters for timing)."""
    return stage_config(stage, "reference", processes=processes, one_step=True, **overrides)


class Runner:
    """Runs estimates, in `jobs` worker processes when jobs > 1 (an estimate is one single-threaded Python loop).

    Specs are (config, vocab size, target, variant name)."""

    def __init__(self, jobs: int = 1):
        self.pool = None
        if jobs > 1:  # spawn: fresh processes, no inherited process group or fake mode
            self.pool = ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"))

    def map(self, specs: list[tuple]):
        """Estimates in the order of `specs`, each yielded as soon as it and those before it are done."""
        return map(_estimate_spec, specs) if self.pool is None else self.pool.map(_estimate_spec, specs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


def _estimate_spec(spec: tuple):
    cfg, vocab_size, target, variant = spec
    return estimate(cfg, vocab_size, target, adapt=VARIANTS[variant][1])


def reference_snapshots(directory=None) -> dict:
    """{stage: (path, StepReport)} for each of the reference's snapshots found in `directory`."""
    found = {}
    for stage, name in SNAPSHOTS.items():
        path = Path(directory) / name if directory else None
        if path and path.is_file():
            found[stage] = (path, allocator_snapshot.analyse(allocator_snapshot.load(path)))
    return found


def reference_ladder(
    target: str = "cuda",
    variants=tuple(VARIANTS),
    vocab_size: int = REFERENCE_VOCAB,
    runner: Runner | None = None,
    progress=print,
    snapshots: dict | None = None,
) -> list[dict]:
    """Estimates of the reference's five memory stages, in each variant, beside its documented peaks.

    Beside them too, where `snapshots` (from reference_snapshots) has one: what its traced step allocated."""
    runner = runner or Runner()
    rows = []
    for stage in stages_of("memory"):
        declared = declaration(stage)
        rows.append({"stage": stage, "change": declared.change, "documented_mib": declared.reference["peak_mib"]})
        if stage in (snapshots or {}):
            path, report = snapshots[stage]
            rows[-1].update(snapshot=report, snapshot_file=path.name)
    specs = [(reference_config(row["stage"]), vocab_size, target, name) for row in rows for name in variants]
    jobs = [(row, name) for row in rows for name in variants]
    for (row, name), est in zip(jobs, runner.map(specs)):
        row[name] = est
        progress(f"  {row['stage']} [{name}]: {est.peak_mib:,.0f} MiB ({est.seconds:.1f} s)")
    return rows


def snapshot_breakdown(est_breakdown: dict) -> dict:
    """An estimate's breakdown in the snapshot's categories (buffers are 'other' there; rounding is not modelled)."""
    b = est_breakdown
    return {**{k: b[k] for k in STACK_CATEGORIES[:5]}, "other": b["buffers"] + b["other"], "rounding": 0.0}


def reference_figures(rows: list[dict]) -> list[tuple[str, str]]:
    """What the estimates and the reference's snapshots say about the documented peaks: (figure, value) pairs.

    gpt/memory/README.md explains each, under the same name."""
    by = {r["stage"]: r for r in rows}
    s0, s2 = by["memory_0_baseline"], by["memory_2_checkpointing"]["reference"].breakdown_mib
    cfg = reference_config("memory_0_baseline")
    n_embd = s0["reference"].model.n_embd
    embed = _cuda_mib(cfg.batch_size * cfg.block_size * n_embd * 4) + _cuda_mib(cfg.block_size * n_embd * 4)
    figures = [
        (
            "NewGELU: its extra saved tensors at memory_0's peak",
            f"+{s0['newgelu'].peak_mib - s0['project'].peak_mib:,.0f} MiB",
        ),
        (
            "Gradient lifetime: the previous step's gradients at memory_0's peak",
            f"+{s0['reference'].breakdown_mib['gradients']:,.0f} MiB",
        ),
        ("Embedding locals: tok_emb and pos_emb at every forward-pass peak", f"+{embed:,.1f} MiB"),
        (
            "AdamW's foreach temporaries at memory_2's peak (MemTracker: optimizer state)",
            f"{s2['optimizer_state'] - 2 * s2['parameters']:,.0f} MiB",
        ),
    ]
    traced = [r for r in rows if r.get("snapshot")]
    if traced:
        figures += _snapshot_figures(rows, traced)
    else:
        single = [r["documented_mib"] - r["reference"].peak_mib for r in rows if r["stage"] != "memory_4_fsdp"]
        figures.append(
            (
                "Documented peaks above the 'reference' estimates, memory_0..3 (no snapshots given)",
                f"{min(single):,.0f} to {max(single):,.0f} MiB",
            )
        )
    return figures + _fsdp_unit_figures(by["memory_4_fsdp"])


def pct(a: float, b: float) -> float:
    """a against b, in percent."""
    return 100 * (a / b - 1)


def _snapshot_figures(rows: list[dict], traced: list[dict]) -> list[tuple[str, str]]:
    """The reference's snapshots against the estimates (category by category), the vocabulary, the warm-up."""

    def worst(keys):
        return max(
            abs(pct(snapshot_breakdown(r["reference"].breakdown_mib)[k], r["snapshot"].peak_mib_by_category[k]))
            for r in traced
            for k in keys
        )

    def each(fmt):
        return "; ".join(f"{r['stage'][:8]}: {fmt(r)}" for r in traced)

    first = traced[0]["snapshot"]
    start, by_category = first.start_mib_by_category, first.peak_mib_by_category
    tied, untied = vocabulary_of(first.params)
    gaps = [r["documented_mib"] - r["snapshot"].peak_mib for r in traced]
    blocks = [r["snapshot"].reallocated_large_blocks for r in traced]
    cfg = reference_config("memory_0_baseline")
    figures = [
        (
            "Snapshots: the traced step's peak, and the 'reference' estimate's error",
            each(
                lambda r: (
                    f"{r['snapshot'].peak_mib:,.0f} MiB ({r['snapshot_file']}), estimate "
                    f"{pct(r['reference'].peak_mib, r['snapshot'].peak_mib):+.1f}%"
                )
            ),
        ),
        (
            "Snapshots: the largest error by category, parameters / gradients / optimizer state",
            f"{worst(STACK_CATEGORIES[:3]):.2f}%",
        ),
        ("Snapshots: the largest error by category, activations", f"{worst(['activations']):.2f}%"),
        (
            "Not modelled at memory_0's traced peak: 'other' beyond the cuBLAS workspaces, and 'rounding'",
            f"{by_category['other'] - snapshot_breakdown(traced[0]['reference'].breakdown_mib)['other']:,.1f} and "
            f"{by_category['rounding']:,.0f} MiB",
        ),
        (
            "Start of the traced step: allocated; the previous step's gradients; neither state nor gradients",
            f"{first.start_mib:,.0f}; {start['gradients']:,.1f}; {start['other'] + start['rounding']:,.0f} MiB",
        ),
        (
            "Vocabulary: fp32 values in the traced gradients, and the vocabulary they make at GPT-2-large's shape",
            f"{first.params:,}: {untied:g} tokens with an untied head ({tied:g} tied)",
        ),
        (
            "Documented minus traced peak",
            each(
                lambda r: (
                    f"{r['documented_mib'] - r['snapshot'].peak_mib:,.0f} MiB "
                    f"({pct(r['documented_mib'], r['snapshot'].peak_mib):+.1f}%)"
                )
            ),
        ),
        (
            "Blocks over 1 MiB allocated anew every step, alive at the traced peak (at most 1 MiB of remainder each)",
            " and ".join(f"{b:,}" for b in blocks)
            + (" (fewer MiB than the gaps)" if all(b < g for b, g in zip(blocks, gaps)) else ""),
        ),
        (
            "The warm-up's first step: memory_0's traced peak without AdamW's moments and earlier gradients",
            f"{by_category['gradients'] + by_category['optimizer_state']:,.0f} MiB less",
        ),
        (
            "minGPT's loop keeping the previous step's logits",
            f"{cfg.batch_size * cfg.block_size * REFERENCE_VOCAB * 4 / MiB:.1f} MiB",
        ),
    ]
    return figures + _untraced_figures(rows, traced)


def _untraced_figures(rows: list[dict], traced: list[dict]) -> list[tuple[str, str]]:
    """The stages without a snapshot against the traced ones: documented above a traced step, estimates below."""

    figures = []
    untraced = [r for r in rows if not r.get("snapshot") and r["stage"] != "memory_4_fsdp"]
    if untraced:
        over = [pct(r["documented_mib"], r["snapshot"].peak_mib) for r in traced]
        short = [-pct(r["reference"].peak_mib, r["documented_mib"]) for r in untraced]
        figures.append(
            (
                f"Without a snapshot ({', '.join(r['stage'][:8] for r in untraced)}): documented above a "
                f"traced step for the traced stages; the estimates below the documented figures",
                f"{min(over):+.1f}% to {max(over):+.1f}%; {min(short):.1f}% to {max(short):.1f}% short",
            )
        )
    return figures


def _fsdp_unit_figures(row: dict) -> list[tuple[str, str]]:
    """memory_4: what FSDP gathers per unit here (one block) and as a single unit (the whole model)."""
    one = (4 * _params_at(n_layer=2) - 4 * _params_at(n_layer=1)) / MiB
    full = 4 * row["reference"].params / MiB
    doc, est = row["documented_mib"], row["reference"].peak_mib
    return [
        (
            "memory_4: parameters gathered at a time, one block (FSDP2 per block, here) / the whole model (one unit)",
            f"{one:,.0f} / {full:,.0f} MiB",
        ),
        (
            "memory_4 if FSDP wrapped the model as one unit (a hypothesis, not a simulation)",
            f"{est + full - one:,.0f} MiB ({100 * ((est + full - one) / doc - 1):+.1f}% vs the documented {doc:,})",
        ),
    ]


def _cuda_mib(nbytes: int) -> float:
    return cuda_block_bytes(nbytes) / MiB


def vocabulary_of(params: int) -> tuple[float, float]:
    """The vocabulary that gives GPT-2-large's shape (block 128) `params` parameters, with a tied and an untied head."""
    per_token = _params_at(vocab_size=2) - _params_at(vocab_size=1)  # n_embd: the tied head adds no parameters
    rest = params - (_params_at(vocab_size=1) - per_token)
    return rest / per_token, rest / (2 * per_token)


def _params_at(**overrides) -> int:
    """Parameters of the reference model with `overrides` (built on the meta device: no memory)."""
    with torch.device("meta"):
        config = GPTConfig.from_preset("gpt2-large", **{"vocab_size": REFERENCE_VOCAB, "block_size": 128, **overrides})
        return GPT(config).num_params()


# ---- the largest model that fits ----------------------------------------------------------------------------

SHAPE_RULE = (
    "GPT-2-large width (n_embd 1280, 20 heads) with more or fewer layers; the reference setup "
    "otherwise (vocab 65, block 128, batch 32, fp32, naive attention, dropout 0.1)"
)


def fit_settings(world_sizes=(2, 8), budget_gib: float = 80) -> list[tuple[str, str, int, int | None]]:
    """The fit report's rows: (label, stage, processes, documented parameters for an 80 GB GPU).

    Before the ladder, after it with FSDP, and with the lean ladder's last stage (its host memory reported beside)."""
    documented = DOCUMENTED_FIT if budget_gib == 80 else {}
    rows = [("before: memory_0 settings (1 GPU)", "memory_0_baseline", 1, documented.get("before"))]
    for w in world_sizes:
        rows.append(
            (
                f"after: memory_3 settings + FSDP ({w} GPUs)",
                "memory_4_fsdp",
                w,
                documented.get("after") if w == 2 else None,
            )
        )
    for w in world_sizes:
        rows.append(
            (f"beyond: lean_3, FSDP bf16 + chunked loss + CPU offload ({w} GPUs)", "lean_3_cpu_offload", w, None)
        )
    return rows


VERIFY_MAX_LAYERS = 200  # full-depth fake runs cost ~0.1 s per layer on 1 process, ~0.5 s under FSDP


def largest_fit(
    stage: str,
    world_size: int,
    budget_mib: float,
    target: str = "cuda",
    variant: str = "project",
    runner: Runner | None = None,
    progress=print,
    verify_max_layers: int = VERIFY_MAX_LAYERS,
) -> dict:
    """The most layers (at the shape rule's width) whose estimated peak fits `budget_mib`.

    The peak is affine in n_layer: two cheap estimates give the slope, and the answer is checked at full depth (n fits,
    n + 1 does not); beyond `verify_max_layers` a third estimate at 16 layers checks the line, and the answer is
    extrapolated along it (marked `extrapolated`, with the check's residual)."""
    if budget_mib <= 0:
        raise UserError(f"the budget must be positive, got {budget_mib / 1024:g} GiB")
    runner = runner or Runner()
    known = {}

    def peaks(*depths: int) -> list[float]:
        todo = [n for n in dict.fromkeys(depths) if n not in known]
        specs = [(reference_config(stage, world_size, n_layer=n), REFERENCE_VOCAB, target, variant) for n in todo]
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
        return {
            "n_layer": n,
            "params": known[check].params + per_layer * (n - check),
            "peak_mib": p_check + slope * (n - check),
            "next_peak_mib": p_check + slope * (n + 1 - check),
            "host_mib": _along(known, hi, check, n),
            "estimates": len(known),
            "extrapolated": True,
            "affine_residual_mib": residual,
        }
    for _ in range(5):
        p_n, p_next = peaks(n, n + 1)
        if p_n > budget_mib:
            if n == 1:
                one = known[1]
                state = sum(one.breakdown_mib[k] for k in ("parameters", "gradients", "optimizer_state"))
                raise UserError(
                    f"a budget of {budget_mib / 1024:g} GiB is below what even a 1-layer model needs on {stage} "
                    f"({p_n / 1024:.2f} GiB, of which {state / 1024:.2f} GiB parameters, gradients and "
                    f"optimizer state)"
                )
            n = max(1, n - math.ceil((p_n - budget_mib) / slope))
        elif p_next <= budget_mib:
            n = n + 1 + math.floor((budget_mib - p_next) / slope)
        else:
            return {
                "n_layer": n,
                "params": known[n].params,
                "peak_mib": p_n,
                "next_peak_mib": p_next,
                "host_mib": known[n].host_mib,
                "estimates": len(known),
                "extrapolated": False,
            }
    raise RuntimeError(f"{stage}: no fit after {len(known)} estimates; the peak is not affine in depth here")


def _along(known: dict, a: int, b: int, n: int) -> float | None:
    """The host memory (CPU offload) at n layers, along the line through the estimates at a and b layers."""
    if known[a].host_mib is None:
        return None
    return known[b].host_mib + (known[b].host_mib - known[a].host_mib) / (b - a) * (n - b)


def documented_shapes(rows: list[dict]) -> list[str]:
    """How the documented parameter counts map onto the shape rule, beside what was found."""
    p1, p2 = _params_at(n_layer=1), _params_at(n_layer=2)
    per_layer, rest = p2 - p1, p1 - (p2 - p1)
    notes = []
    for r in rows:
        line = f"{r['setting']}: {r['n_layer']} layers, {r['params'] / 1e6:,.0f}M parameters"
        if r["documented_params"]:
            layers = (r["documented_params"] - rest) / per_layer
            line += (
                f"; documented {r['documented_params'] / 1e6:,.0f}M = {layers:.1f} layers at this width "
                f"({100 * (r['params'] / r['documented_params'] - 1):+.0f}% here)"
            )
        notes.append(line)
    before = next((r for r in rows if r["world_size"] == 1), None)
    after = next((r for r in rows if r["world_size"] == 2), None)
    if before and after and before["documented_params"]:
        notes.append(
            f"Ratio after/before here: {after['params'] / before['params']:.1f}x (documented "
            f"{DOCUMENTED_FIT['after'] / DOCUMENTED_FIT['before']:.1f}x; the settings the documented figures most "
            f"likely used: gpt/memory/README.md)."
        )
    return notes


# ---- against measured runs ------------------------------------------------------------------------------


# What compare holds an estimate against, by the record's memory method (gpt/peak_memory.py:MEMORY_METHODS).
COMPARED = {
    "memtracker": ("peak_memory_mib", "MemTracker's peak"),
    "cuda_max_allocated": ("peak_memory_allocated_mib", "max_memory_allocated"),
    # CUDA graphs: their pool is allocated while warm-up records them and replays allocate nothing, so the timed
    # repeats' allocated peak misses it. The allocated peak over warm-up holds it; records made before that figure
    # existed (it is null or absent) give the reservation, an upper bound (cached free blocks included).
    "cuda_max_reserved": ("peak_memory_warmup_allocated_mib", "max_memory_allocated over warm-up (graph pool in)"),
}
UPPER_BOUND = ("peak_memory_reserved_mib", "max_memory_reserved (an upper bound)")


def compared_peak(record: dict) -> tuple[float, str]:
    """(MiB, what it is): the figure of a record that holds what the planner estimates.

    For a CUDA-graph stage the larger of the allocated peaks over warm-up and over the timed repeats (with few warm-up
    steps the graphs are recorded in the repeats)."""
    m = record["metrics"]
    cuda = record.get("device", {}).get("type") == "cuda"
    method = record.get("choices", {}).get("memory_method") or ("cuda_max_allocated" if cuda else "memtracker")
    key, what = COMPARED.get(method, COMPARED["memtracker"])
    if m.get(key) is None:
        key, what = UPPER_BOUND if method == "cuda_max_reserved" else ("peak_memory_mib", "the record's peak")
    elif method == "cuda_max_reserved":
        return max(m[key], m.get("peak_memory_allocated_mib") or 0.0), what
    return m[key], what


def compare_records(records: list[dict], runner: Runner | None = None, progress=print) -> list[dict]:
    """Estimate every measured stage record (ok) with its own config and device type, against its compared_peak."""
    measured = [r for r in records if r.get("status") == "ok" and (r.get("metrics") or {}).get("peak_memory_mib")]
    specs = [
        (
            TrainConfig.from_dict(r["config"]),
            r["model"]["vocab_size"],
            "cuda" if r["device"]["type"] == "cuda" else "cpu",
            "project",
        )
        for r in measured
    ]
    rows = []
    for rec, spec, est in zip(measured, specs, (runner or Runner()).map(specs)):
        peak, what = compared_peak(rec)
        row = {"stage": rec["stage"], "measured_mib": round(peak, 2), "measured": what, "target": spec[2]}
        err = 100 * (est.peak_mib / peak - 1)
        rows.append({**row, "estimate_mib": est.peak_mib, "error_pct": round(err, 2), "notes": est.notes})
        progress(f"  {rec['stage']}: measured {peak:,.2f} MiB ({what}), estimate {est.peak_mib:,.2f} MiB ({err:+.1f}%)")
    return rows

"""python -m gpt.memory: the GPU memory planner's command line (how it works: docs/memory-planner.md).

estimate   predicted peak memory of one stage, with a breakdown (stage-script options + a target)
reference  the reference's five memory stages, estimated beside their documented peaks and its snapshots
fit        the largest model that fits a memory budget, before and after the memory ladder
compare    estimates against the peaks that real runs measured (a directory of stage records)
snapshot   a CUDA allocator snapshot (torch.cuda.memory._dump_snapshot): its step's peak and what made it
"""

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

from gpt import allocator_snapshot, record_reuse
from gpt.allocator_snapshot import STACK_CATEGORIES
from gpt.data import load_prepared
from gpt.errors import UserError, exit_on_user_error
from gpt.ladder import all_stages, declaration, lineage, stage_config
from gpt.memory.estimator import TARGET_DEVICES, estimate
from gpt.memory.planner import (
    NOTES,
    REFERENCE_VOCAB,
    SHAPE_RULE,
    SNAPSHOT_DIR,
    SNAPSHOTS,
    VARIANTS,
    VERIFY_MAX_LAYERS,
    Runner,
    compare_records,
    documented_shapes,
    fit_settings,
    largest_fit,
    reference_figures,
    reference_ladder,
    reference_snapshots,
    snapshot_breakdown,
    vocabulary_of,
)
from gpt.optimizations.parallel import is_distributed
from gpt.peak_memory import MEMORY_PARTS
from gpt.records import read_record, write_record
from gpt.settings_profiles import PROFILES


def main(argv: list[str] | None = None) -> None:
    raise SystemExit(_main(sys.argv[1:] if argv is None else argv))


@exit_on_user_error
def _main(argv: list[str]) -> int:
    args = parse_args(argv)
    return args.command(args) or 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m gpt.memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(required=True, metavar="{estimate,reference,fit,compare,snapshot}")
    for add in (_estimate_command, _reference_command, _fit_command, _compare_command, _snapshot_command):
        add(sub)
    return p.parse_args(argv)


def _estimate_command(sub) -> None:
    e = sub.add_parser("estimate", help="predicted peak memory of one stage")
    e.add_argument("--stage", default="memory_0_baseline", help="stage name, e.g. memory_2_checkpointing")
    e.add_argument("--profile", default="reference", help=f"settings profile: {', '.join(PROFILES)}")
    e.add_argument("--preset", help="model preset (gpt-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl)")
    for name in ("n-layer", "n-head", "n-embd"):
        e.add_argument(f"--{name}", type=int, help=f"override the preset's {name.replace('-', '_')}")
    e.add_argument("--batch-size", type=int, help="samples per optimizer step and process")
    e.add_argument("--block-size", type=int, help="sequence length")
    e.add_argument(
        "--vocab-size",
        type=int,
        help="vocabulary size (default: 65 for the reference profile, else the profile's prepared data)",
    )
    e.add_argument("--world-size", type=int, help="processes of a DDP/FSDP stage (default: the stage's)")
    _common(e, json_help="also write the estimate as JSON")
    e.add_argument(
        "--reference-code",
        action="store_true",
        help="emulate the reference's code: NewGELU, minGPT's gradient lifetime and embedding locals",
    )
    e.add_argument(
        "--snapshot-out",
        metavar="FILE",
        help="also write the simulated step as a CUDA memory snapshot (the pickle format of "
        "torch.cuda.memory._dump_snapshot), to open at https://pytorch.org/memory_viz; target cuda",
    )
    e.set_defaults(command=cmd_estimate)


def _reference_command(sub) -> None:
    r = sub.add_parser("reference", help="the reference's memory stages vs their documented peaks")
    r.add_argument(
        "--vocab-size",
        type=int,
        default=REFERENCE_VOCAB,
        help=f"vocabulary of the reference setup (default {REFERENCE_VOCAB}, its characters)",
    )
    r.add_argument(
        "--snapshots",
        metavar="DIR",
        default=SNAPSHOT_DIR,
        help="directory with the reference's allocator snapshots (0_VRAM_Original.pickle, "
        "1_VRAM_Gradient_Accumulation.pickle; from ailzhang/EfficientPyTorch, "
        "chapter_10_mingpt/memory_profiles/); default: shared/reference/snapshots beside the "
        "checkout or a directory above it, if present",
    )
    _common(r, json_help="write memory_reference.json-style output here", jobs=True)
    r.set_defaults(command=cmd_reference)


def _fit_command(sub) -> None:
    f = sub.add_parser("fit", help="the largest model that fits a budget, before and after the ladder")
    f.add_argument("--budget-gib", type=float, default=80.0, help="memory per GPU in GiB (default 80)")
    f.add_argument(
        "--world-sizes",
        type=int,
        nargs="*",
        default=[2, 8],
        help="FSDP process counts for the 'after' rows (default: 2 8)",
    )
    f.add_argument(
        "--reference-code",
        action="store_true",
        help="emulate the reference's code: NewGELU, minGPT's gradient lifetime and embedding locals",
    )
    f.add_argument(
        "--verify-max-layers",
        type=int,
        default=VERIFY_MAX_LAYERS,
        help=f"deepest answer checked with full-depth estimates; deeper ones are extrapolated "
        f"(default {VERIFY_MAX_LAYERS}; a sharded layer costs ~0.5 s of estimate, so checking the "
        f"8-GPU answer, ~1700 layers, takes about 15 minutes)",
    )
    _common(f, json_help="write memory_fit.json-style output here", jobs=True)
    f.set_defaults(command=cmd_fit)


def _compare_command(sub) -> None:
    c = sub.add_parser("compare", help="estimates vs the peaks measured by real runs")
    c.add_argument("--runs", required=True, help="directory of stage records (<stage>.json)")
    c.add_argument("--json", help="write memory_compare.json-style output here")
    c.add_argument(
        "--jobs",
        type=int,
        default=min(os.cpu_count() or 1, 4),
        help="estimates run at once, one process each (default: the cores, at most 4)",
    )
    c.set_defaults(command=cmd_compare)


def _snapshot_command(sub) -> None:
    s = sub.add_parser("snapshot", help="a CUDA allocator snapshot: its step's peak and what made it")
    s.add_argument("pickle", help="a file written by torch.cuda.memory._dump_snapshot (read as plain data only)")
    s.add_argument("--device", type=int, help="CUDA device of the trace (default: the one with the most events)")
    s.add_argument("--json", help="also write the figures as JSON")
    s.set_defaults(command=cmd_snapshot)


def _common(parser, json_help: str, jobs: bool = False):
    if jobs:
        parser.add_argument(
            "--jobs",
            type=int,
            default=min(os.cpu_count() or 1, 4),
            help="estimates run at once, one process each (default: the cores, at most 4)",
        )
    parser.add_argument(
        "--target",
        default="cuda",
        choices=TARGET_DEVICES,
        help="device whose memory is predicted (default cuda); the simulation always runs on fake CPU tensors",
    )
    parser.add_argument("--json", help=json_help)
    if jobs:  # the machine-independent reports (gpt/record_reuse.py)
        parser.add_argument(
            "--reuse",
            metavar="JSON",
            help="an earlier --json output of this command: copied to "
            "--json instead of computing, if it was computed from the same code, torch and arguments",
        )


def _jobs(args) -> int:
    if args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    return args.jobs


def reusable(argv: list[str], source: Path) -> bool:
    """Whether `python -m gpt.memory <argv> --reuse <source>` would copy `source` instead of computing its report."""
    return record_reuse.still_valid(read_record(source), _reuse_key(parse_args(argv)))


def _since(started: float) -> float:
    """A report's seconds in its record: its computation, after the imports (a quick run plans with them)."""
    return round(time.perf_counter() - started, 1)


def _reuse_key(args) -> dict:
    """What a reference or fit report follows from besides the code (gpt/record_reuse.py).

    Its arguments, and the reference's snapshots by content (their directory differs from checkout to checkout)."""
    key = {k: v for k, v in vars(args).items() if k not in ("command", "json", "jobs", "reuse", "snapshots")}
    key["command"] = args.command.__name__
    if getattr(args, "snapshots", None):
        found = [Path(args.snapshots) / name for name in SNAPSHOTS.values()]
        key["snapshots"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in found if p.is_file()}
    return key


# ---- estimate -------------------------------------------------------------------------------------------


def estimate_config(args):
    """The stage's config from its profile and the overrides, and the vocabulary size."""
    base = stage_config(args.stage, args.profile)  # UserError on an unknown stage or profile
    world = args.world_size
    if world is not None and not is_distributed(base) and world != 1:
        raise UserError(f"{args.stage} runs one process; --world-size applies to the DDP/FSDP stages")
    if world is not None and is_distributed(base) and world < 2:
        raise UserError(f"--world-size must be at least 2 for {args.stage}, got {world}")
    cfg = stage_config(
        args.stage,
        args.profile,
        processes=world,
        one_step=True,
        preset=args.preset,
        n_layer=args.n_layer,
        n_head=args.n_head,
        n_embd=args.n_embd,
        batch_size=args.batch_size,
        block_size=args.block_size,
    )
    vocab = args.vocab_size
    if vocab is None:
        if args.profile == "reference":
            vocab = REFERENCE_VOCAB
        else:
            try:
                vocab = load_prepared(cfg.data_dir).vocab_size
            except UserError:
                raise UserError(
                    f"no prepared data in {cfg.data_dir} to read the vocabulary size from: pass --vocab-size"
                ) from None
    return cfg, vocab


def cmd_estimate(args) -> int:
    cfg, vocab = estimate_config(args)
    if args.snapshot_out and args.target != "cuda":
        raise UserError("--snapshot-out writes the CUDA caching allocator's format: use it with --target cuda")
    est = estimate(
        cfg,
        vocab,
        args.target,
        adapt=VARIANTS["reference"][1] if args.reference_code else None,
        record=bool(args.snapshot_out),
    )
    micro = f" (micro-batch {cfg.micro_batch_size} x {cfg.grad_accum_steps})" if cfg.grad_accum_steps > 1 else ""
    print(
        f"{args.stage} ({args.profile} profile), target {args.target}, "
        f"{'per process of ' + str(est.world_size) if est.world_size > 1 else '1 process'}"
    )
    m = est.model
    print(
        f"  model: {cfg.preset} shape, {m.n_layer} layers x {m.n_embd} wide, {m.n_head} heads: "
        f"{est.params:,} parameters, vocab {vocab}, block {cfg.block_size}, "
        f"batch {cfg.batch_size}{micro}, dropout {cfg.dropout}"
        f"{', reference code emulated' if args.reference_code else ''}"
    )
    print(f"  changes: {'; '.join(declaration(name).change for name in lineage(args.stage))}")
    print(f"predicted peak: {_mib(est.peak_mib)} MiB")
    for key in MEMORY_PARTS:
        print(f"  {key.replace('_', ' '):<16} {_mib(est.breakdown_mib[key]):>12} MiB")
    if est.host_mib is not None:
        print(f"  host memory for the offloaded state: {_mib(est.host_mib)} MiB per process")
    for note in est.notes:
        print(f"  note: {note}")
    print(f"(estimated in {est.seconds:.1f} s on fake tensors: no memory was allocated)")
    if args.snapshot_out:
        path = allocator_snapshot.write(args.snapshot_out, est.snapshot)
        print(
            f"wrote the simulated step to {path}: open it at https://pytorch.org/memory_viz, or read it with "
            f"`python -m gpt.memory snapshot {path}`"
        )
    if args.json:
        write_record(
            Path(args.json),
            {
                "kind": "estimate",
                "stage": args.stage,
                "profile": args.profile,
                "target": args.target,
                "vocab_size": vocab,
                "config": cfg.to_dict(),
                "params": est.params,
                "world_size": est.world_size,
                "peak_mib": est.peak_mib,
                "breakdown_mib": est.breakdown_mib,
                "host_mib": est.host_mib,
                "notes": est.notes,
            },
        )
    return 0


def _mib(x: float) -> str:
    return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.1f}"


# ---- reference --------------------------------------------------------------------------------------------


def cmd_reference(args) -> int:
    started = time.perf_counter()
    if args.json and record_reuse.reuse_record(args.reuse, _reuse_key(args), args.json):
        return 0
    snapshots = reference_snapshots(args.snapshots)
    print(
        f"Estimating the reference's memory stages (target {args.target}, vocab {args.vocab_size}); "
        f"snapshots: {', '.join(p.name for p, _ in snapshots.values()) or 'none'}"
    )
    with Runner(_jobs(args)) as runner:
        rows = reference_ladder(args.target, vocab_size=args.vocab_size, runner=runner, snapshots=snapshots)
    names = list(VARIANTS)
    print("\nPeak memory, MiB (error vs documented; the traced step: the reference's snapshot of one later step):")
    for name in names:
        print(f"  {name:<9} = {VARIANTS[name][0]}")
    print(f"  {'stage':<24}" + "".join(f"{n:>20}" for n in names) + f"{'documented':>12}{'traced step':>26}")
    for row in rows:
        cells = "".join(f"{_with_error(row[n].peak_mib, row['documented_mib']):>20}" for n in names)
        traced = ""
        if row.get("snapshot"):
            peak = row["snapshot"].peak_mib
            traced = f"{peak:,.0f} (estimate {_pct(row['reference'].peak_mib, peak)})"
        print(f"  {row['stage']:<24}{cells}{row['documented_mib']:>12,}{traced:>26}")
    print("\nBreakdown of the 'reference' column at its peak, MiB (estimate / traced step where there is one):")
    keys = list(STACK_CATEGORIES) + ["rounding"]
    print(f"  {'stage':<24}" + "".join(f"{k[:15]:>18}" for k in keys))
    for row in rows:
        est = snapshot_breakdown(row["reference"].breakdown_mib)
        traced = row["snapshot"].peak_mib_by_category if row.get("snapshot") else None
        print(
            f"  {row['stage']:<24}"
            + "".join(f"{(f'{est[k]:,.0f} / {traced[k]:,.0f}' if traced else f'{est[k]:,.0f}'):>18}" for k in keys)
        )
    figures = reference_figures(rows)
    print(f"\nWhat the estimates and snapshots say about the documented peaks (explained in {NOTES}):")
    print("\n".join(f"- {label}: {value}" for label, value in figures))
    if args.json:
        stages = []
        for row in rows:
            est, doc = row["reference"], row["documented_mib"]
            stages.append(
                {
                    "stage": row["stage"],
                    "change": row["change"],
                    "estimate_mib": est.peak_mib,
                    "documented_mib": doc,
                    "error_pct": round(100 * (est.peak_mib / doc - 1), 2),
                    "breakdown_mib": est.breakdown_mib,
                    **{f"{n}_estimate_mib": row[n].peak_mib for n in names if n != "reference"},
                }
            )
            if row.get("snapshot"):
                traced = row["snapshot"]
                stages[-1].update(
                    snapshot_file=row["snapshot_file"],
                    snapshot_mib=round(traced.peak_mib, 2),
                    snapshot_error_pct=round(100 * (est.peak_mib / traced.peak_mib - 1), 2),
                    snapshot_breakdown_mib={k: round(v, 2) for k, v in traced.peak_mib_by_category.items()},
                    estimate_snapshot_categories_mib=snapshot_breakdown(est.breakdown_mib),
                    snapshot_start_mib=round(traced.start_mib, 2),
                    snapshot_params=traced.params,
                )
        write_record(
            Path(args.json),
            {
                "kind": "reference",
                "target": args.target,
                "vocab_size": args.vocab_size,
                "variant": VARIANTS["reference"][0],
                "stages": stages,
                "figures": [{"figure": label, "value": value} for label, value in figures],
                "seconds": _since(started),
                "provenance": record_reuse.provenance(_reuse_key(args)),
            },
        )
    return 0


def _pct(value: float, base: float) -> str:
    return f"{100 * (value / base - 1):+.1f}%"


def _with_error(value: float, documented: float) -> str:
    return f"{value:,.0f} ({_pct(value, documented)})"


# ---- fit ---------------------------------------------------------------------------------------------------


def cmd_fit(args) -> int:
    started = time.perf_counter()
    budget = args.budget_gib * 1024
    if budget <= 0:
        raise UserError(f"--budget-gib must be positive, got {args.budget_gib:g}")
    if any(w < 2 for w in args.world_sizes):
        raise UserError("--world-sizes are FSDP process counts: each must be at least 2")
    if args.json and record_reuse.reuse_record(args.reuse, _reuse_key(args), args.json):
        return 0
    code = "reference" if args.reference_code else "project"
    print(f"Largest model within {args.budget_gib:g} GiB per GPU (target {args.target}, {VARIANTS[code][0]}).")
    print(f"Shape rule: {SHAPE_RULE}.")
    rows = []
    with Runner(_jobs(args)) as runner:
        for label, stage, world, documented in fit_settings(args.world_sizes, args.budget_gib):
            print(f"  {label}:")
            found = largest_fit(
                stage, world, budget, args.target, code, runner, verify_max_layers=args.verify_max_layers
            )
            rows.append(
                {"setting": label, "stage": stage, "world_size": world, **found, "documented_params": documented}
            )
    print(
        f"\n  {'setting':<66}{'layers':>7}{'parameters':>12}{'peak MiB':>11}{'+1 layer':>11}{'documented':>12}"
        f"{'host GiB/GPU':>14}"
    )
    for r in rows:
        doc = f"{r['documented_params'] / 1e6:,.0f}M" if r["documented_params"] else ""
        host = f"{r['host_mib'] / 1024:,.0f}" if r.get("host_mib") is not None else ""
        mark = " *" if r["extrapolated"] else ""
        print(
            f"  {r['setting']:<66}{r['n_layer']:>7}{r['params'] / 1e6:>11,.0f}M{r['peak_mib']:>11,.0f}"
            f"{r['next_peak_mib']:>11,.0f}{doc:>12}{host:>14}{mark}"
        )
    notes = documented_shapes(rows)
    notes += [
        f"{r['setting']}: the GPU holds the activations and one unit's gathered parameters; the sharded "
        f"parameters, their gradients and AdamW's state take {r['host_mib'] / 1024:,.0f} GiB of host memory "
        f"per GPU ({r['world_size'] * r['host_mib'] / 1024:,.0f} GiB for all {r['world_size']}): host RAM, "
        "not the GPU, bounds this setting."
        for r in rows
        if r.get("host_mib") is not None
    ]
    notes += [
        f"* {r['setting']}: extrapolated along the estimates at 8 and 16 layers (full-depth fake runs "
        f"of that many sharded layers take minutes); the peak at 16 layers was "
        f"{r['affine_residual_mib']:+,.1f} MiB off the line through 4 and 8 layers."
        for r in rows
        if r["extrapolated"]
    ]
    print("\n" + "\n".join(f"- {n}" for n in notes))
    if args.json:
        write_record(
            Path(args.json),
            {
                "kind": "fit",
                "budget_gib": args.budget_gib,
                "target": args.target,
                "shape_rule": SHAPE_RULE,
                "code": VARIANTS[code][0],
                "rows": rows,
                "notes": notes,
                "seconds": _since(started),
                "provenance": record_reuse.provenance(_reuse_key(args)),
            },
        )
    return 0


# ---- compare ---------------------------------------------------------------------------------------------


def cmd_compare(args) -> int:
    started = time.perf_counter()
    runs = Path(args.runs)
    if not runs.is_dir():
        raise UserError(f"no runs directory {runs}")
    known = set(all_stages())
    records = []
    for path in sorted(runs.glob("*.json")):
        if path.stem in known:
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, json.JSONDecodeError) as e:
                raise UserError(f"{path} is not a readable record ({e})") from None
    if not records:
        raise UserError(f"no stage records (<stage>.json) in {runs}")
    print(f"Estimates vs measured peaks ({runs}):")
    with Runner(_jobs(args)) as runner:
        rows = compare_records(records, runner)
    profiles = sorted({r.get("profile", "?") for r in records})
    for r in rows:
        if r["notes"]:
            print(f"  note ({r['stage']}): {'; '.join(r['notes'])}")
    skipped = [r["stage"] for r in records if r.get("status") != "ok"]
    if skipped:
        print(f"  not compared (no measurement): {', '.join(skipped)}")
    if args.json:
        record = {"kind": "compare", "profile": ", ".join(profiles), "stages": rows, "seconds": _since(started)}
        write_record(Path(args.json), record)
    return 0


# ---- snapshot ---------------------------------------------------------------------------------------------


def cmd_snapshot(args) -> int:
    path = Path(args.pickle)
    r = allocator_snapshot.analyse(allocator_snapshot.load(path), args.device)
    print(
        f"{path.name}: device {r.device}, {r.allocations:,} allocations in {r.trace_ms:,.1f} ms of trace "
        f"({r.events:,} events)"
    )
    print(f"At the start of the trace: {r.start_mib:,.1f} MiB allocated")
    _categories(r.start_mib_by_category)
    tied, untied = vocabulary_of(r.params)
    if not r.params:
        print("  no gradients in the trace (no backward pass, nor a zero_grad freeing earlier ones)")
    elif untied < 1:
        print(f"  the gradients hold {r.params:,} fp32 values: fewer than a GPT-2-large-shaped model has")
    else:
        print(
            f"  the gradients hold {r.params:,} fp32 values (parameters); at GPT-2-large's shape (36 x 1280, "
            f"block 128) that is a vocabulary of {untied:g} with an untied output head (minGPT), {tied:g} with a "
            f"tied one"
        )
    print(
        f"Peak: {r.peak_mib:,.1f} MiB allocated, {r.peak_ms:,.1f} ms after the first event (event "
        f"{r.peak_event:,} of {r.events:,}), {r.peak_where}"
    )
    _categories(r.peak_mib_by_category)
    print(f"  {r.reallocated_large_blocks:,} blocks over 1 MiB that the step allocates anew are alive at the peak")
    print(
        "(block sizes replayed with the caching allocator's rules and checked against the snapshot's blocks)"
        if r.blocks_replayed
        else "(block sizes not replayed: requests rounded up to 512 bytes stand in for the allocator's blocks)"
    )
    if args.json:
        write_record(
            Path(args.json),
            {
                "kind": "snapshot",
                "file": str(path),
                **r.as_dict(),
                "vocabulary_untied_gpt2_large": untied,
                "vocabulary_tied_gpt2_large": tied,
            },
        )
    return 0


def _categories(mib: dict) -> None:
    why = {
        "other": "allocated before recording, no gradient of that size: buffers, workspaces",
        "rounding": "allocator blocks beyond the requests rounded to 512 bytes",
    }
    for key, value in mib.items():
        if value or key in ("parameters", "gradients", "optimizer_state", "activations"):
            note = f"   ({why[key]})" if key in why else ""
            print(f"  {key.replace('_', ' '):<16} {_mib(value):>12} MiB{note}")


if __name__ == "__main__":
    main()

"""The memory planner's section of results.md: its three reports (memory_*.json, `python -m gpt.memory --json`)."""

import math
from pathlib import Path

from gpt.formatting import fmt_mib, fmt_pct, table
from gpt.memory.planner import NOTES, reference_config
from gpt.record_reuse import reused_note, was_reused
from gpt.records import read_record
from gpt.report.plots import pyplot, save_figure, short, stacked_memory_bars

REPORTS = ("compare", "reference", "fit")  # the `python -m gpt.memory` reports a full run keeps (gpt/run_all.py)
MACHINE_INDEPENDENT = ("reference", "fit")  # those it reuses from records/ while their code is unchanged


def report_file(report: str) -> str:
    """The file of a run directory that holds one of the REPORTS."""
    return f"memory_{report}.json"


def planner_section(runs: Path, plots: Path, rel: str) -> list[str]:
    """The section, from the planner's reports in `runs` (none: no section); its figure goes to `plots`."""
    files = {k: read_record(runs / report_file(k)) for k in REPORTS}
    if not any(files.values()):
        return []
    lines = [
        "## Memory planner",
        "",
        "Estimates of `python -m gpt.memory` (FakeTensorMode: shapes only, no real memory used).",
    ]
    notes = {name: reused_note(files[name]) for name in ("reference", "fit") if was_reused(files[name])}
    if len(notes) == 2 and len(set(notes.values())) == 1:  # computed together: one sentence
        lines += [f"The reference and fit reports were {reused_note(files['fit'], plural=True)}."]
    else:
        lines += [f"The {name} report was {note}." for name, note in notes.items()]
    if files["reference"]:
        lines += reference_part(files["reference"], plots, rel)
    if files["fit"]:
        lines += fit_part(files["fit"])
    if files["compare"]:
        lines += compare_part(files["compare"])
    return lines


def reference_part(ref: dict, plots: Path, rel: str) -> list[str]:
    """The reference's memory ladder: estimates beside the documented and traced peaks, their breakdown, a plot."""
    lines = [
        "",
        f"### Estimate vs the reference's H100 figures ({ref.get('target', '?')})",
        "",
        "Documented: `max_memory_allocated` over the reference's warm-up. Traced step: the peak of one "
        "later step in the reference's own allocator snapshot, where there is one.",
        "",
    ]
    lines += table(
        ["stage", "change", "documented MiB", "traced step MiB", "estimate MiB", "vs documented", "vs traced step"],
        [
            [
                s["stage"],
                s.get("change", ""),
                fmt_mib(s.get("documented_mib")),
                fmt_mib(s.get("snapshot_mib")),
                fmt_mib(s["estimate_mib"]),
                fmt_pct(s.get("error_pct")),
                fmt_pct(s.get("snapshot_error_pct")),
            ]
            for s in ref.get("stages", [])
        ],
    )
    traced = [s for s in ref.get("stages", []) if s.get("snapshot_breakdown_mib")]
    if traced:
        lines += ["", "At the peak, category by category (MiB, estimate / traced step):", ""]
        keys = list(traced[0]["snapshot_breakdown_mib"])
        lines += table(
            ["category"] + [s["stage"] for s in traced],
            [
                [key.replace("_", " ")]
                + [
                    f"{fmt_mib(s['estimate_snapshot_categories_mib'].get(key))} / "
                    f"{fmt_mib(s['snapshot_breakdown_mib'][key])}"
                    for s in traced
                ]
                for key in keys
            ],
        )
    if ref.get("figures"):  # the forensics of the documented peaks: explained, with where to read them, in NOTES
        lines += [
            "",
            f"What the estimates and the reference's snapshots say about the documented peaks ({len(ref['figures'])} "
            f"figures: `python -m gpt.memory reference`, or `figures` in memory_reference.json): "
            f"[{NOTES}]({NOTES}).",
        ]
    if plot_reference(ref, plots / "memory_planner.png"):
        lines += ["", f"![estimated breakdown]({rel}/memory_planner.png)"]
    return lines


def plot_reference(ref: dict, path: Path) -> bool:
    """The estimated breakdown of each stage, with the documented and traced peaks marked (False: nothing to plot)."""
    stages = [s for s in ref.get("stages", []) if s.get("breakdown_mib")]
    if not stages:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.2))
    breakdowns = [{**s["breakdown_mib"], "total": s["estimate_mib"]} for s in stages]
    cfg = reference_config(stages[0]["stage"])
    stacked_memory_bars(
        ax,
        [short(s["stage"]) for s in stages],
        breakdowns,
        f"The reference's memory ladder on {ref.get('target', '?')}: {cfg.preset}, vocabulary "
        f"{ref.get('vocab_size', '?')}, block {cfg.block_size}, batch {cfg.batch_size}, fp32\n"
        "estimated peak by category (MiB), documented and traced peaks marked",
    )
    for key, style, legend in (("documented_mib", "k_", "documented"), ("snapshot_mib", "r_", "traced step")):
        marks = [(i, s[key]) for i, s in enumerate(stages) if s.get(key)]
        if marks:
            ax.plot(*zip(*marks), style, markersize=30, mew=2, label=legend)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


# The host memory the "largest model" rows may assume per GPU: an 8-GPU H100 server with 2 TiB of host memory
# (NVIDIA's DGX H100). A CPU-offload row that needs more is not shown as a fit.
HOST_GIB_PER_GPU = 256
HOST_ASSUMED = "256 GiB per GPU, as on an 8-GPU H100 server with 2 TiB of host memory (a DGX H100)"


def fit_part(fit: dict) -> list[str]:
    """The largest model that fits the budget; a row that needs more host memory than HOST_GIB_PER_GPU: in words."""
    rows = fit.get("rows", [])
    too_big = [r for r in rows if (r.get("host_mib") or 0) > HOST_GIB_PER_GPU * 1024]
    lines = ["", f"### Largest model that fits in {fit.get('budget_gib', '?')} GiB of GPU memory", ""]
    if fit.get("shape_rule"):
        lines += [f"Shapes: {fit['shape_rule']}. Host memory assumed for CPU offload: {HOST_ASSUMED}.", ""]
    lines += table(
        [
            "setting",
            "processes",
            "layers",
            "parameters",
            "peak MiB (GPU)",
            "documented parameters",
            "host memory per GPU",
        ],
        [
            [
                row["setting"] + (" *" if row.get("extrapolated") else ""),
                str(row["world_size"]),
                str(row["n_layer"]),
                f"{row['params'] / 1e6:,.0f}M",
                fmt_mib(row["peak_mib"]),
                f"{row['documented_params'] / 1e6:,.0f}M" if row.get("documented_params") else "",
                f"{row['host_mib'] / 1024:,.0f} GiB" if row.get("host_mib") is not None else "",
            ]
            for row in rows
            if row not in too_big
        ],
    )
    dropped = {r["setting"] for r in too_big}
    notes = [n for n in fit.get("notes", []) if not any(n.lstrip("* ").startswith(d) for d in dropped)]
    notes += [host_bound(r) for r in too_big]
    return lines + [""] + [f"- {note}" for note in notes]


def host_bound(row: dict) -> str:
    """Why a CPU-offload row is not in the table, and about how deep host memory (affine in depth) lets it go."""
    per_layer = row["host_mib"] / row["n_layer"]
    layers = math.floor(HOST_GIB_PER_GPU * 1024 / per_layer)
    return (
        f"Not in the table: {row['setting']}. Its GPU memory would fit {row['n_layer']:,} layers "
        f"({row['params'] / 1e6:,.0f}M parameters), but their sharded parameters, gradients and AdamW state "
        f"would take {row['host_mib'] / 1024:,.0f} GiB of host memory per GPU; with {HOST_GIB_PER_GPU} GiB per "
        f"GPU, host memory bounds it at about {layers:,} layers (about "
        f"{row['params'] * layers / row['n_layer'] / 1e6:,.0f}M parameters, scaled along the host memory per "
        "layer)."
    )


def compare_part(compare: dict) -> list[str]:
    """The estimates against the measured peaks; on a CPU (the same tracker both sides) only the stages that differ."""
    stages = compare.get("stages", [])
    lines = ["", f"### Estimate vs measured ({compare.get('profile', '?')} profile)", ""]
    same_tracker = bool(stages) and all(s.get("target") == "cpu" for s in stages)
    shown = [s for s in stages if not same_tracker or s.get("error_pct") is None or abs(s["error_pct"]) >= 0.5]
    if same_tracker:
        lines += [
            f"On a CPU the estimate and the measurement come from the same tracker (MemTracker) running the same "
            f"training code, the one on fake tensors, the other on real ones: {len(stages) - len(shown)} of "
            f"{len(stages)} stages agree within 0.5%, which checks that the planner runs each stage's code, not "
            "that it predicts a GPU. The informative comparisons are against a GPU's allocator: the reference's "
            "H100 figures (`python -m gpt.memory reference`), and `python -m gpt.memory compare --runs "
            "records/h100-2026-11-24`, the project's own H100 records." + (" The stages that differ:" if shown else ""),
            "",
        ]
    if shown:
        lines += table(
            ["stage", "measured MiB", "measured as", "estimate MiB", "error"],
            [
                [
                    s["stage"],
                    fmt_mib(s["measured_mib"]),
                    s.get("measured", ""),
                    fmt_mib(s["estimate_mib"]),
                    "" if s.get("error_pct") is None else f"{s['error_pct']:+.1f}%",
                ]
                for s in shown
            ],
        )
    unestimated = [
        f"- `{s['stage']}`: {note}" for s in stages if s.get("estimate_mib") is None for note in s.get("notes", [])
    ]
    lines += [""] + unestimated if unestimated else []
    if any(s.get("target") == "cuda" for s in stages):
        lines += [
            "",
            "On CUDA each estimate is held against what it predicts, max_memory_allocated; for a stage with "
            "CUDA graphs, whose pool is allocated while warm-up records them, the allocated peak over warm-up "
            "(records older than that figure: the reservation, an upper bound). A compiled stage is "
            "estimated eager.",
        ]
    return lines

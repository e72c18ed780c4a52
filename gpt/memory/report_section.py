"""The memory planner's section of results.md: its three reports (memory_reference.json, memory_fit.json,
memory_compare.json, written by `python -m gpt.memory ... --json` in the run directory) as tables and a figure."""
from pathlib import Path

from gpt.memory.planner import NOTES
from gpt.records import read_record
from gpt.report.formatting import fmt_mib, fmt_pct, table
from gpt.report.plots import pyplot, short, stacked_memory_bars


def planner_section(runs: Path, plots: Path, rel: str) -> list[str]:
    """The section, from the planner's reports in `runs` (none: no section); its figure goes to `plots`."""
    files = {k: read_record(runs / f"memory_{k}.json") for k in ("reference", "fit", "compare")}
    if not any(files.values()):
        return []
    lines = ["## Memory planner", "",
             "Estimates of `python -m gpt.memory` (FakeTensorMode: shapes only, no real memory used)."]
    if files["reference"]:
        lines += reference_part(files["reference"], plots, rel)
    if files["fit"]:
        lines += fit_part(files["fit"])
    if files["compare"]:
        lines += compare_part(files["compare"])
    return lines


def reference_part(ref: dict, plots: Path, rel: str) -> list[str]:
    """The reference's memory ladder: estimates beside the documented peaks and the traced steps, the breakdown
    at the traced peaks, the figures gpt/memory/README.md explains, and the estimated breakdown's plot."""
    lines = ["", f"### Estimate vs the reference's H100 figures ({ref.get('target', '?')})", "",
             "Documented: `max_memory_allocated` over the reference's warm-up. Traced step: the peak of one "
             "later step in the reference's own allocator snapshot, where there is one.", ""]
    lines += table(["stage", "change", "documented MiB", "traced step MiB", "estimate MiB", "vs documented",
                    "vs traced step"], [
        [s["stage"], s.get("change", ""), fmt_mib(s.get("documented_mib")), fmt_mib(s.get("snapshot_mib")),
         fmt_mib(s["estimate_mib"]), fmt_pct(s.get("error_pct")), fmt_pct(s.get("snapshot_error_pct"))]
        for s in ref.get("stages", [])])
    traced = [s for s in ref.get("stages", []) if s.get("snapshot_breakdown_mib")]
    if traced:
        lines += ["", "At the peak, category by category (MiB, estimate / traced step):", ""]
        keys = list(traced[0]["snapshot_breakdown_mib"])
        lines += table(["category"] + [s["stage"] for s in traced], [
            [key.replace("_", " ")] + [f"{fmt_mib(s['estimate_snapshot_categories_mib'].get(key))} / "
                                       f"{fmt_mib(s['snapshot_breakdown_mib'][key])}" for s in traced]
            for key in keys])
    figures = [[f["figure"], f["value"]] for f in ref.get("figures", [])]
    if figures:
        lines += ["", f"What the estimates and snapshots say about the documented peaks ({NOTES} explains each "
                      "figure):", ""]
        lines += table(["figure", "value"], figures)
    if plot_reference(ref, plots / "memory_planner.png"):
        lines += ["", f"![estimated breakdown]({rel}/memory_planner.png)"]
    return lines


def plot_reference(ref: dict, path: Path) -> bool:
    """The estimated breakdown of each stage, with the documented and traced peaks marked (False: nothing to plot)."""
    stages = [s for s in ref.get("stages", []) if s.get("breakdown_mib")]
    if not stages:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    breakdowns = [{**s["breakdown_mib"], "total": s["estimate_mib"]} for s in stages]
    stacked_memory_bars(ax, [short(s["stage"]) for s in stages], breakdowns, "estimated peak breakdown (MiB)")
    for key, style, legend in (("documented_mib", "k_", "documented"), ("snapshot_mib", "r_", "traced step")):
        marks = [(i, s[key]) for i, s in enumerate(stages) if s.get(key)]
        if marks:
            ax.plot(*zip(*marks), style, markersize=30, mew=2, label=legend)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def fit_part(fit: dict) -> list[str]:
    """The largest model that fits the budget, before and after the ladder and beyond it."""
    lines = ["", f"### Largest model that fits in {fit.get('budget_gib', '?')} GiB", ""]
    if fit.get("shape_rule"):
        lines += [f"Shapes: {fit['shape_rule']}", ""]
    lines += table(["setting", "processes", "layers", "parameters", "peak MiB (GPU)", "documented parameters",
                    "host memory per GPU"], [
        [row["setting"] + (" *" if row.get("extrapolated") else ""), str(row["world_size"]), str(row["n_layer"]),
         f"{row['params'] / 1e6:,.0f}M", fmt_mib(row["peak_mib"]),
         f"{row['documented_params'] / 1e6:,.0f}M" if row.get("documented_params") else "",
         f"{row['host_mib'] / 1024:,.0f} GiB" if row.get("host_mib") is not None else ""]
        for row in fit.get("rows", [])])
    return lines + [""] + [f"- {note}" for note in fit.get("notes", [])]


def compare_part(compare: dict) -> list[str]:
    """The estimates against the peaks this run measured."""
    lines = ["", f"### Estimate vs measured ({compare.get('profile', '?')} profile)", ""]
    lines += table(["stage", "measured MiB", "measured as", "estimate MiB", "error"], [
        [s["stage"], fmt_mib(s["measured_mib"]), s.get("measured", ""), fmt_mib(s["estimate_mib"]),
         "" if s.get("error_pct") is None else f"{s['error_pct']:+.1f}%"]
        for s in compare.get("stages", [])])
    unestimated = [f"- `{s['stage']}`: {note}" for s in compare.get("stages", [])
                   if s.get("estimate_mib") is None for note in s.get("notes", [])]
    lines += [""] + unestimated if unestimated else []
    if any(s.get("target") == "cuda" for s in compare.get("stages", [])):
        lines += ["", "On CUDA each estimate is held against what it predicts, max_memory_allocated; for a stage with "
                  "CUDA graphs, whose pool is allocated while warm-up records them, the allocated peak over warm-up "
                  "(records older than that figure: the reservation, an upper bound). A compiled stage is "
                  "estimated eager."]
    return lines

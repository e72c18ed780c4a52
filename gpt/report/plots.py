"""The ladders' figures (matplotlib, Agg: no display): bars, memory breakdown and over a step, where time goes."""

from pathlib import Path

from gpt.formatting import fmt_mib, fmt_num
from gpt.ladder import lineage
from gpt.report.rows import SHOWN_MEMORY_PARTS, Rung, samples_label
from gpt.report.where_time_goes import seconds_by_category, shares
from gpt.step_profiler import TIME_CATEGORIES, label


def short(stage: str, ladder: bool = False) -> str:
    """'speed_3_non_blocking' -> '3 non blocking' for axis labels ('speed 3 non blocking' with `ladder`)."""
    prefix, i, name = stage.split("_", 2)
    return f"{prefix + ' ' if ladder else ''}{i} {name.replace('_', ' ')}"


def labels(rungs: list[Rung]) -> list[str]:
    """Axis labels of a figure's stages: with their ladder's name where it shows stages of several ladders."""
    several = len({r.stage.split("_", 1)[0] for r in rungs}) > 1
    return [short(r.stage, several) for r in rungs]


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, layout: bool = True) -> None:
    """Write a figure to `path` (110 dpi) and free it; `layout`: tight_layout first (False: the caller laid it out)."""
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)


def _bars(ax, rungs: list[Rung], values: list[float | None], fmt, errors=None, color="tab:blue"):
    """One bar per stage; a stage without a value shows its status instead of a bar."""
    x = range(len(rungs))
    heights = [v or 0 for v in values]
    ax.bar(x, heights, yerr=errors, color=color, capsize=3)
    tops = [h + e for h, e in zip(heights, errors or [0] * len(heights))]  # label above the error bar
    top = max(tops) or 1
    for i, (r, v) in enumerate(zip(rungs, values)):
        text = fmt(v) if v is not None else (r.record or {}).get("status", "not run")
        ax.text(
            i,
            tops[i] + top * 0.02,
            text,
            ha="center",
            va="bottom",
            fontsize=8,
            color="black" if v is not None else "tab:red",
        )
    ax.set_xticks(list(x), labels(rungs), rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, top * 1.18)


def _relative(ax, rungs: list[Rung], key: str, ref_key: str, what: str):
    """This run and the reference, each relative to its own baseline (different hardware, same shape)."""
    x = list(range(len(rungs)))
    # a ladder beyond the book is drawn relative to its lineage's baseline (speed_0, memory_0)
    base = rungs[0].baseline if rungs[0].baseline_stage else rungs[0].record
    changes = [r.vs(base, key) for r in rungs]  # peak memory only as measured alike
    ours = [None if d is None else 1 + d / 100 for d in changes]
    documented = [(i, r.reference.get(ref_key)) for i, r in zip(x, rungs)]
    first = rungs[0].baseline_reference if rungs[0].baseline_stage else rungs[0].reference
    # the documented run relative to its own baseline, for the stages the book documents (a ladder beyond it: none)
    documented = [(i, v / first[ref_key]) for i, v in documented if v is not None] if first.get(ref_key) else []
    theirs = [v for _, v in documented]
    if documented:
        ax.plot(*zip(*documented), "s--", color="tab:gray", label="documented (H100)")
    ax.plot(
        [i for i, v in zip(x, ours) if v is not None],
        [v for v in ours if v is not None],
        "o-",
        color="tab:orange",
        label="this run",
    )
    ax.set_xticks(x, labels(rungs), rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, max([1.05] + [v * 1.1 for v in ours + theirs if v is not None]))
    ax.set_title(f"{what} relative to {lineage(rungs[0].stage)[0]}")
    ax.axhline(1, color="black", lw=0.5)
    ax.legend(fontsize=8)


def finished(rungs: list[Rung], title: str) -> tuple[list[Rung], str]:
    """The stages a ladder's figure shows (those that finished: no empty slots), and its title naming the others."""
    names = dict(zip((r.stage for r in rungs), labels(rungs)))
    left_out = [f"{names[r.stage]} ({(r.record or {}).get('status', 'not run')})" for r in rungs if not r.ok]
    return [r for r in rungs if r.ok], title + (f" (not shown: {', '.join(left_out)})" if left_out else "")


def plot_speed(rungs: list[Rung], path: Path, title: str = "Speed ladder") -> None:
    plt = pyplot()
    rungs, title = finished(rungs, title)
    n = samples_label(rungs)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    _bars(
        axes[0], rungs, [r.m("seconds_mean") for r in rungs], fmt_num, errors=[r.m("seconds_std") or 0 for r in rungs]
    )
    axes[0].set_title(f"seconds per {n} samples (mean ± std)")
    _bars(axes[1], rungs, [r.m("tokens_per_s") for r in rungs], lambda v: f"{v:,.0f}", color="tab:green")
    axes[1].set_title("tokens / s")
    _relative(axes[2], rungs, "seconds_mean", "seconds", "time")
    fig.suptitle(title)
    save_figure(fig, path)


def stacked_memory_bars(ax, labels: list[str], breakdowns: list[dict | None], title: str):
    """Stacked bars of a memory breakdown (MiB), one per stage; 'other' holds buffers and the rest."""
    plt = pyplot()
    bottoms = [0.0] * len(labels)
    colors = plt.get_cmap("tab10").colors
    for j, part in enumerate((*SHOWN_MEMORY_PARTS, "other")):
        values = []
        for b in breakdowns:
            if not b:
                values.append(0.0)
            elif part == "other":
                values.append(max(0.0, b.get("total", 0) - sum(b.get(k, 0) for k in SHOWN_MEMORY_PARTS)))
            else:
                values.append(b.get(part, 0))
        ax.bar(range(len(labels)), values, bottom=bottoms, label=part.replace("_", " "), color=colors[j])
        bottoms = [a + v for a, v in zip(bottoms, values)]
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.3 * max(bottoms + [1e-9]))  # headroom for the legend
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend(fontsize=8)


def plot_memory(rungs: list[Rung], path: Path, title: str = "Memory ladder") -> None:
    """Peak memory, its breakdown and the relative view; `rungs` may run on into a ladder that continues from it."""
    plt = pyplot()
    rungs, title = finished(rungs, title)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    _bars(axes[0], rungs, [r.m("peak_memory_mib") for r in rungs], fmt_mib, color="tab:purple")
    axes[0].set_title("peak memory, MiB (per process)")
    stacked_memory_bars(
        axes[1], labels(rungs), [r.m("memory_breakdown_mib") for r in rungs], "at the peak: what the memory holds (MiB)"
    )
    _relative(axes[2], rungs, "peak_memory_mib", "peak_mib", "peak memory")
    fig.suptitle(title)
    save_figure(fig, path)


def plot_time_breakdown(ladders: dict[str, list[Rung]], path: Path) -> bool:
    """Stacked bars, a panel per ladder: the timed seconds split by the profiled breakdown (False: no breakdown)."""
    shown = {name: rungs for name, rungs in ladders.items() if any(shares(r.record) for r in rungs)}
    if not shown:
        return False
    plt = pyplot()
    sizes = [sum(1 for r in rungs if shares(r.record)) for rungs in shown.values()]
    fig, axes = plt.subplots(
        len(shown),
        1,
        figsize=(11, 1.0 + 0.4 * sum(sizes) + 0.9 * len(shown)),
        gridspec_kw={"height_ratios": sizes},
        squeeze=False,
    )
    colors = dict(zip(TIME_CATEGORIES, plt.get_cmap("tab10").colors))
    for ax, (name, rungs) in zip(axes[:, 0], shown.items()):
        rungs = [r for r in rungs if shares(r.record)]  # a stage without a breakdown gets no empty bar
        parts = [seconds_by_category(r.record) for r in rungs]
        left = [0.0] * len(rungs)
        for c in TIME_CATEGORIES:
            widths = [p.get(c, 0.0) for p in parts]
            if any(widths):
                ax.barh(range(len(rungs)), widths, left=left, color=colors[c], label=label(c))
                left = [a + w for a, w in zip(left, widths)]
        ax.set_yticks(range(len(rungs)), [short(r.stage) for r in rungs], fontsize=8)
        ax.invert_yaxis()  # the baseline on top, as in the tables
        ax.set_xlabel(f"seconds per {samples_label(rungs)} samples")
        ax.set_title(f"{name.capitalize()} ladder: where the time goes", fontsize=10)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    save_figure(fig, path)
    return True


def plot_timelines(rungs: list[Rung], path: Path) -> bool:
    """Live tensor memory through one instrumented training step, one curve per memory stage."""
    curves = [(r, r.m("memory_timeline_mib")) for r in rungs]
    curves = [(r, c) for r, c in curves if c]
    if not curves:
        return False
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for (_, c), name in zip(curves, labels([r for r, _ in curves])):
        x = [100 * i / max(1, len(c) - 1) for i in range(len(c))]
        ax.plot(x, c, label=f"{name} (peak {fmt_mib(max(c))} MiB)")
    ax.set_xlabel("progress through one training step (%, allocation events)")
    ax.set_ylabel("live tensor memory, MiB")
    ax.set_title("Memory over one training step (rank 0 for distributed stages)")
    ax.set_ylim(0)
    ax.legend(fontsize=8)
    save_figure(fig, path)
    return True

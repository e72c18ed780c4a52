"""Two figures that read across sections: the project's thesis and one change across machines."""

import statistics
import textwrap
from pathlib import Path

from gpt.committed_records import NOTE, PUBLISHED, published_dir
from gpt.formatting import table
from gpt.ladder import ladder_names, parent_of, stages_of
from gpt.records import read_record
from gpt.report.plots import pyplot, save_figure, short
from gpt.report.rows import MACHINE_FILE, Rung, display, ladders_of, load_records, ok
from gpt.report.speedrun import BASELINE as SPEEDRUN_BASELINE
from gpt.report.speedrun import Speedrun
from gpt.report.tables import ANCHOR, anchor_change
from gpt.report.time_to_loss import BASELINE, LossRuns
from gpt.settings_profiles import default_profile

THESIS = "thesis.png"
MACHINES = "machines.png"


def thesis_points(runs: LossRuns, sr: Speedrun) -> list[tuple[str, str, float, float | None]]:
    """(stage, group, speedup per sample, speedup to the target or None) against speed_0, a point per stage.

    The speed and fast stages from their runs to a loss, the speedrun's stages that hold from theirs (seeds' means)."""
    base, base_target = runs.records.get(BASELINE), runs.to_target(BASELINE)
    points = []
    if ok(base) and base_target:
        rate, seconds = base["metrics"]["tokens_per_s"], base_target["seconds"]
        for stage in runs.stages:
            r = runs.records.get(stage)
            if ok(r):
                reached = runs.to_target(stage)
                group = "speed" if stage.startswith("speed_") else "fast"
                points.append(
                    (stage, group, r["metrics"]["tokens_per_s"] / rate, reached and seconds / reached["seconds"])
                )
    base_runs = [r for r in sr.baseline if ok(r)]
    if base_runs and sr.holds(SPEEDRUN_BASELINE):
        rate = statistics.fmean(r["metrics"]["tokens_per_s"] for r in base_runs)
        seconds = statistics.fmean(sr.seconds(SPEEDRUN_BASELINE))
        for stage, records in sr.stages.items():
            if records and all(ok(r) for r in records) and sr.holds(stage):
                mine = statistics.fmean(r["metrics"]["tokens_per_s"] for r in records)
                points.append((stage, "speedrun", mine / rate, seconds / sr.mean_seconds(stage)))
    return points


def plot_thesis(runs: LossRuns, sr: Speedrun, path: Path) -> bool:
    """Speedup per sample (x) against speedup to the target (y), log-log, the diagonal drawn; False: no baseline."""
    points = thesis_points(runs, sr)
    if len(points) < 2:
        return False
    plt = pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(12, 6))
    colors = {"speed": "tab:blue", "fast": "tab:green", "speedrun": "tab:red"}
    reached = [y for *_, y in points if y]
    floor = min(reached + [1.0]) / 1.8  # the strip of the stages that do not reach the target
    for group, color in colors.items():
        mine = [(s, x, y) for s, g, x, y in points if g == group]
        hit = [(s, x, y) for s, x, y in mine if y]
        missed = [(s, x) for s, x, y in mine if not y]
        if hit:
            ax.scatter([x for _, x, _ in hit], [y for *_, y in hit], color=color, label=f"{group} stages", zorder=3)
        if missed:
            ax.scatter([x for _, x in missed], [floor] * len(missed), marker="v", color=color, zorder=3,
                       label=f"{group} stages: target not reached")  # fmt: skip
    missed = [short(s, True) for s, _, _, y in points if not y]
    if missed:  # named together: their points crowd one strip
        names = textwrap.fill("target not reached: " + ", ".join(missed), 110)
        ax.text(0.01, 0.015, names, transform=ax.transAxes, ha="left", va="bottom", fontsize=7)
    xs = [x for _, _, x, _ in points]
    low, high = min(xs + reached + [1.0]) / 1.3, max(xs + reached + [1.0]) * 1.3
    ax.plot([low, high], [low, high], "--", color="0.5", lw=1, label="speedup to the target = speedup per sample")
    ax.axhline(floor * 1.4, color="0.6", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    strip = floor * 1.4  # below it no speedup: the strip of the stages that do not reach the target
    for axis, lowest in ((ax.xaxis, 0.0), (ax.yaxis, strip)):  # "2x" labels, no mathtext (its cycles keep frames)
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _, lowest=lowest: f"{v:g}x" if v >= lowest else ""))
        axis.set_minor_formatter(NullFormatter())
    ax.text(-0.01, floor, "not\nreached", transform=ax.get_yaxis_transform(), ha="right", va="center", fontsize=8)
    ax.set_xlim(low, high)
    ax.set_ylim(floor / 1.8, high)
    ax.set_xlabel(f"speedup per sample against {BASELINE} (tokens/s over its tokens/s)")
    ax.set_ylabel(f"speedup to the target against {BASELINE} (its seconds over the stage's)", labelpad=30)
    ax.set_title("Per-sample speedup against speedup to the target, stage by stage")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()  # the axes at their final size first: labels are placed in points, and a layout moves points
    label_apart(ax, [(short(s), x, y) for s, _, x, y in points if y])
    save_figure(fig, path, layout=False)
    return True


def label_apart(ax, labels: list[tuple[str, float, float]], size: float = 7) -> None:
    """Name each point beside it where the label covers no other label or point, with a line to it where moved.

    Tried in order: right of the point and level with it, then left, then further up or down each side. Each label's
    box is the one the renderer draws (the axes' limits, scales and layout set first), not one estimated from its
    length."""
    from matplotlib.text import Text  # here: the report imports matplotlib only where it draws
    from matplotlib.transforms import Bbox

    renderer = ax.figure.canvas.get_renderer()

    def text_box(label):  # where the label's text is drawn now, without its line to the point
        label.update_positions(renderer)
        return Text.get_window_extent(label, renderer)

    def fits(label, offset) -> bool:  # the label, moved to `offset`, covers nothing placed
        label.set_position(offset)
        return not any(text_box(label).overlaps(other) for other in taken)

    to_pt = 72 / ax.figure.dpi
    points = [ax.transData.transform((x, y)) for _, x, y in labels]
    marker = 4 / to_pt  # a marker's half-width, in pixels
    taken = [Bbox.from_extents(px - marker, py - marker, px + marker, py + marker) for px, py in points]
    shifts = [0.0] + [sign * step * size * 1.3 for step in range(1, 12) for sign in (1, -1)]
    for text, x, y in sorted(labels, key=lambda label: -label[2]):  # from the top down
        probe = ax.annotate(text, (x, y), textcoords="offset points", xytext=(6.0, -size / 2), fontsize=size)
        width = text_box(probe).width * to_pt
        candidates = [(dx, dy - size / 2) for dy in shifts for dx in (6.0, -6.0 - width)]
        chosen = next((c for c in candidates if fits(probe, c)), candidates[0])
        probe.remove()
        line = dict(arrowstyle="-", color="0.6", lw=0.5) if abs(chosen[1] + size / 2) > size else None
        placed = ax.annotate(text, (x, y), textcoords="offset points", xytext=chosen, fontsize=size, arrowprops=line)
        taken.append(text_box(placed))


def thesis_lines(rel: str) -> list[str]:
    return [
        "",
        "### Speedup per sample against speedup to the target",
        "",
        f"Each stage against `{BASELINE}`, from the runs to a loss: its tokens/s over `{BASELINE}`'s (x) and "
        f"`{BASELINE}`'s training seconds to the target over its own (y). The speed and fast stages are timed to "
        "this section's target; the speedrun's stages that hold, to the speedrun's (section Speedrun), with their "
        "seeds' means. On the diagonal a per-sample gain carries over whole; below it, part of it buys another "
        "model; above it, a change makes the model learn more per sample. A stage that does not reach the target "
        "within its budget sits on the strip at the bottom.",
        "",
        f"![speedup per sample against speedup to the target]({rel}/{THESIS})",
    ]


# ---- one change across machines -----------------------------------------------------------------------------


def records_folders(runs: Path) -> list[Path]:
    """The page's own records folder, then every committed one (records/*/) that holds a speed or fast record."""
    folders = [Path(runs)] + sorted(p for p in PUBLISHED.glob("*/") if p.is_dir())
    seen, found = set(), []
    for folder in folders:
        if folder.resolve() not in seen:
            seen.add(folder.resolve())
            if any(s.startswith(("speed_", "fast_")) for s in load_records(folder)):
                found.append(folder)
    return found


def timed_rungs(folder: Path) -> list[Rung]:
    """The speed and fast ladders' stages of one records folder (fast continuing from speed_5), every stage listed."""
    ladders = ladders_of(load_records(folder))
    return [r for name in ladder_names("also") for r in ladders.get(name, [])]


def machine_of(folder: Path, rungs: list[Rung]) -> str:
    """The folder's machine, profile and provenance as its records give them, for the legend and the caption."""
    done = [r.record for r in rungs if r.ok]
    machines = sorted({machine_label(folder, r) for r in done})
    profiles = sorted({r.get("profile", "?") for r in done})
    older = f" (its {NOTE} says how it was made)" if (folder / NOTE).is_file() else ""
    return f"{', '.join(machines)}, profile {', '.join(profiles)}{older}"


def plot_machines(series: list[tuple[str, dict[str, float]]], stages: list[str], path: Path) -> None:
    """Grouped bars: each stage's change against the stage above, in %, one bar per series (a missing one: none)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(15, 5.4))
    width = 0.8 / len(series)
    colors = plt.get_cmap("tab10").colors
    for j, (name, changes) in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i, s in enumerate(stages) if s in changes]
        ax.bar(xs, [changes[s] for s in stages if s in changes], width, label=name, color=colors[j % len(colors)])
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(stages)), [short(s, True) for s in stages], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time change against the stage above, %  (below 0: faster)")
    ax.set_title("One change across machines: each stage's time against the stage above")
    ax.grid(axis="y", color="0.9")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    save_figure(fig, path)


def machines_section(runs: Path, plots: Path, rel: str) -> list[str]:
    """The section: the figure and a caption naming each series' machine; [] when no folder has speed records."""
    folders = records_folders(runs)
    if not folders or folders[0] != Path(runs):  # the page's own run has no speed or fast record
        return []
    series, caption, documented, anchor = [], [], {}, {}
    for folder in folders:
        rungs = timed_rungs(folder)
        changes = {r.stage: d for r in rungs if (d := r.vs(r.parent, "seconds_mean")) is not None}
        documented |= {r.stage: d for r in rungs if (d := r.ref_vs("seconds", r.parent_reference)) is not None}
        anchor |= {r.stage: d for r in rungs if (d := anchor_change(r)) is not None}
        if changes:
            devices = sorted({r.record["device"]["name"] for r in rungs if r.ok})
            series.append((f"{display(folder)}: {', '.join(devices)}", changes))
            caption.append(f"`{display(folder)}`: {machine_of(folder, rungs)}")
        elif folder != Path(runs):  # listed all the same, so that a folder does not vanish from the section unsaid
            why = f" (its {NOTE} says why)" if (folder / NOTE).is_file() else ""
            caption.append(f"`{display(folder)}`: no bar, none of these stages finished there{why}")
    if not series:
        return []
    if documented:
        series.append(("the book's documented H100 run", documented))
        caption.append("the book's documented H100 run: each stage script's REFERENCE seconds")
    if anchor:
        series.append((f"{ANCHOR} (fast stages' anchor)", anchor))
        caption.append(f"{ANCHOR}: the fast stages' anchor, ms per step on one data-centre GPU (GPT-2 124M)")
    stages = [s for s in stages_of(*ladder_names("also")) if parent_of(s)]
    plot_machines(series, stages, plots / MACHINES)
    return [
        "",
        "## One change across machines",
        "",
        "Each speed and fast stage's time change against the stage above (fast_1 against speed_5), on every records "
        "folder of this repository that has them, beside the documented figures; a bar is missing where a stage "
        "did not finish. The series:",
        "",
        *[f"- {c}." for c in caption],
        "",
        f"![one change across machines]({rel}/{MACHINES})",
    ]


def machine_label(folder: Path, record: dict) -> str:
    """A run's machine as a reader compares machines: the device, and the CPU's kind where machine.json names it."""
    machine = read_record(folder / MACHINE_FILE) or {}
    cores = f"{machine['cpu_count']}-core " if machine.get("cpu_count") else ""
    if record["device"]["type"] == "cpu":
        return f"{cores}{machine.get('cpu') or record['device']['name'] + ' (its kind not recorded)'}"
    return f"{record['device']['name']} (host: {cores}{machine.get('cpu') or 'CPU, its kind not recorded'})"


def is_default_run(folder: Path) -> bool:
    """Whether `folder` is where a default run of some device commits its records (the root results.md is its page)."""
    return any(Path(folder).resolve() == published_dir(default_profile(d), d).resolve() for d in ("cpu", "cuda"))


def speedrun_machine_row(folder: Path, sr: Speedrun) -> list[str] | None:
    """One run's speedrun: its machine, commit, `speed_0`, the last stage that held there and what did not finish."""
    if not sr.ran or not sr.holds(SPEEDRUN_BASELINE):
        return None
    held = [s for s in sr.stages if sr.holds(s)]
    record = sr.baseline[0]
    page = folder / "results.md"
    if not page.is_file() and is_default_run(folder):  # a default run's: the project's page
        page = PUBLISHED.parent / "results.md"
    link = f"[{display(folder)}]({display(page)})" if page.is_file() else f"`{display(folder)}`"
    base, (base_walls, _) = sr.mean_seconds(SPEEDRUN_BASELINE), sr.walls(SPEEDRUN_BASELINE)
    commit = (record.get("env") or {}).get("git_commit")  # a stand-in's record has none
    cells = [link, machine_label(folder, record), commit[:7] if commit else "not recorded", f"{base:.1f}"]
    if not held:
        return [*cells, "none held", "", ""]
    last = held[-1]
    mine, (walls, _) = sr.mean_seconds(last), sr.walls(last)
    whole = f"; {statistics.fmean(base_walls) / statistics.fmean(walls):.2f}x whole" if base_walls and walls else ""
    later = sr.after(last)
    tried = sum(1 for s in later if sr.stages[s])  # recorded there: failed, skipped or short of the target
    after = [
        f"{tried} recorded, not held" * bool(tried),
        f"{len(later) - tried} not in its records" * bool(len(later) - tried),
    ]
    seeds = len(sr.stages[last])
    return [
        *cells,
        f"`{last}`: {mine:.2f} s ({seeds} seed{'s' * (seeds > 1)})",
        f"{base / mine:.2f}x{whole}",  # as the speedrun table gives a ratio
        "; ".join(a for a in after if a) or "none: the last stage",
    ]


def speedrun_machines_lines(runs: Path) -> list[str]:
    """The speedrun on every committed run that raced it: per machine, the last stage that held and how much sooner.

    The page's own run first, then the committed folders, CPUs before GPUs, each kind's newest first."""
    own = speedrun_machine_row(Path(runs), Speedrun(runs))
    others = []  # (its machine.json, its row)
    for folder in sorted(p for p in PUBLISHED.glob("*/") if p.is_dir() and p.resolve() != Path(runs).resolve()):
        if row := speedrun_machine_row(folder, Speedrun(folder)):
            others.append((read_record(folder / MACHINE_FILE) or {}, row))
    others.sort(key=lambda o: o[0].get("started", ""), reverse=True)  # newest first ...
    others.sort(key=lambda o: (o[0].get("device") != "cpu", o[1][1]))  # ... within each kind (a stable sort)
    rows = [own] * bool(own) + [row for _, row in others]
    if len(rows) < 2:  # the page's own run alone: its section says it all
        return []
    header = ["run", "machine", "commit", "`speed_0` s", "last stage held", "sooner", "the stages after it"]
    return [
        "",
        "### The speedrun on every machine",
        "",
        "Each committed run that raced the speedrun, on its own `speed_0`'s seconds (each machine its own clock; the "
        "task and the target are one everywhere): the last stage whose every seed reached the target, its training "
        "seconds, and how much sooner than `speed_0` it got there in training seconds and in the whole process. Runs "
        "of older code stop at older stages (the later ones are not in their records); a GPU's quick run trains one "
        "seed a stage, a single timing.",
        "",
        *table(header, rows),
    ]

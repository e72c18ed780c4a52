"""The report's "Speedrun" section: speed_0's model, sooner (docs/speedrun.md).

Records are in <runs>/speedrun/, the baseline's seeds where gpt/records.py:speedrun_baseline_dir says. A stage's claim
holds only where every seed it trained with reached the target.
"""

import statistics
from pathlib import Path

import torch

from gpt import ngram_floor
from gpt.flops import peak_label
from gpt.formatting import fmt_num, table
from gpt.ladder import declaration, parent_of, stages_of
from gpt.loss_curve import baseline_model_loss, crossing
from gpt.records import read_record, speedrun_baseline_dir, time_to_loss_dir
from gpt.report.plots import pyplot, save_figure
from gpt.report.rows import MACHINE_FILE, display, ok
from gpt.report.tables import columns_line
from gpt.stage import process_split

LADDER = "speedrun"
BASELINE = stages_of("speed")[0]
KINDS = {"systems": "keeps the model", "training": "changes the training", "model": "changes the model"}
NOISE_SCALE_FILE = "noise_scale.json"  # gpt/noise_scale.py's record, beside the stages' records


def _runs_of(folder: Path, stage: str) -> list[dict]:
    """Every record of a stage in `folder`: its profile's seed and the others (<stage>.seed<N>.json)."""
    paths = [folder / f"{stage}.json", *sorted(folder.glob(f"{stage}.seed*.json"))]
    return [r for r in (read_record(p) for p in paths if p.exists()) if r is not None]


class Speedrun:
    """The records of a run directory's speedrun, and the figures the section reads from them."""

    def __init__(self, runs: Path):
        self.folder = time_to_loss_dir(runs, LADDER)
        self.stages = {s: _runs_of(self.folder, s) for s in stages_of(LADDER)}
        profile = next((r["profile"] for records in self.stages.values() for r in records), None)
        folder = speedrun_baseline_dir(runs, profile) if profile else time_to_loss_dir(runs)  # no stage: no task known
        self.baseline = _runs_of(folder, BASELINE)
        self.target = baseline_model_loss(self.baseline)
        self.noise_scale = read_record(self.folder / NOISE_SCALE_FILE)
        self.ngram_floor = read_record(self.folder / ngram_floor.RECORD_FILE)
        self.machine = read_record(runs / MACHINE_FILE) or {}

    @property
    def ran(self) -> bool:
        return any(self.stages.values())

    def seconds(self, stage: str) -> list[float | None]:
        """Each seed's training seconds to the target (None: not reached, or failed), the baseline's seeds included."""
        return [(c or {}).get("seconds") for c in self._crossings(stage)]

    def tokens(self, stage: str) -> list[float | None]:
        return [(c or {}).get("tokens") for c in self._crossings(stage)]

    def _crossings(self, stage: str) -> list[dict | None]:
        records = self.baseline if stage == BASELINE else self.stages[stage]
        return [
            crossing(r["metrics"]["curve"], self.target) if ok(r) and self.target is not None else None for r in records
        ]

    def holds(self, stage: str) -> bool:
        """Every seed reached the target."""
        seconds = self.seconds(stage)
        return bool(seconds) and None not in seconds

    def after(self, stage: str) -> list[str]:
        """The speedrun's stages after `stage`, in their order (whether or not this run recorded them)."""
        names = list(self.stages)
        return names[names.index(stage) + 1 :]

    def mean_seconds(self, stage: str) -> float | None:
        return statistics.fmean(self.seconds(stage)) if self.holds(stage) else None

    def walls(self, stage: str) -> tuple[list[float], str | None]:
        """Each seed's whole wall clock and the clock that measured it: "run.wall_s" (run_all's) or "process_s".

        The first that every seed's record has, positive; ([], None) otherwise, or where a seed failed."""
        records = self.baseline if stage == BASELINE else self.stages[stage]
        if not records or not all(ok(r) for r in records):
            return [], None
        for clock, read in (
            ("run.wall_s", lambda r: (r.get("run") or {}).get("wall_s")),
            ("process_s", lambda r: r["metrics"].get("process_s")),
        ):
            values = [read(r) for r in records]
            if None not in values and min(values) > 0:  # a stand-in's zero is no measurement
                return values, clock
        return [], None


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return fmt_num(mean) + (f" ({fmt_num(min(values))}-{fmt_num(max(values))})" if len(values) > 1 else "")


def speedup_range(base: list[float], mine: list[float]) -> str:
    """The ratio of the means, with the range its seeds allow (the slowest baseline over the fastest seed, and back)."""
    ratio = statistics.fmean(base) / statistics.fmean(mine)
    if len(base) == 1 and len(mine) == 1:
        return f"{ratio:.2f}x"
    return f"{ratio:.2f}x ({min(base) / max(mine):.2f}-{max(base) / min(mine):.2f}x)"


def wall_cell(sr: Speedrun, stage: str) -> str:
    """The stage's whole wall clock over its seeds, and its ratio to speed_0's where the same clock measured both."""
    walls, clock = sr.walls(stage)
    if not walls:
        return ""
    base, base_clock = sr.walls(BASELINE)
    if base and clock == base_clock:
        return f"{_spread(walls)}; {'1.00x' if stage == BASELINE else speedup_range(base, walls)}"
    return f"{_spread(walls)}" + (" (the process's own)" if clock == "process_s" else "")


def budgets(sr: Speedrun, stage: str) -> list[int | None]:
    """Each seed's token budget (its config's train_tokens): the speedrun's stages stop at the target, earlier."""
    records = sr.baseline if stage == BASELINE else sr.stages[stage]
    return [r.get("config", {}).get("train_tokens") for r in records]


def margin(sr: Speedrun, stage: str) -> tuple[int, float] | None:
    """(the token budget, the least share of it a seed still had at the target); None unless the budgets agree."""
    tokens, budget = sr.tokens(stage), budgets(sr, stage)
    if not tokens or None in budget or None in tokens or len(set(budget)) != 1:
        return None
    return budget[0], max(0.0, min(1 - t / b for t, b in zip(tokens, budget)))


def tokens_cell(sr: Speedrun, stage: str) -> str:
    """The tokens to the target over the seeds, of the budget, and the margin left in it."""
    found = margin(sr, stage)
    return _spread(sr.tokens(stage)) + (f" of {found[0]:,} ({found[1]:.0%} left)" if found else "")


def record_cell(sr: Speedrun, stage: str) -> str:
    """The stage's record file (its profile's seed), linked, and how many more seeds it has."""
    folder = time_to_loss_dir(sr.folder.parent) if stage == BASELINE else sr.folder
    paths = [folder / f"{stage}.json", *sorted(folder.glob(f"{stage}.seed*.json"))]
    path = display(paths[0])
    return f"[{path}]({path})" + (f" (+{len(paths) - 1} seeds)" if len(paths) > 1 else "")


def task_line(sr: Speedrun) -> str:
    """The task in one line: the target, the data, the machine, all from the baseline's records."""
    base = next((r for r in sr.baseline if ok(r)), None)
    if base is None or sr.target is None:
        return f"Task: reach `{BASELINE}`'s final validation loss; it has not finished every seed here."
    cfg, dev = base.get("config", {}), base.get("device", {})
    return (
        f"Task: train from scratch to validation loss {sr.target:.3f} (the worst final loss of `{BASELINE}`'s "
        f"{len(sr.baseline)} seeds) on `{Path(cfg.get('data_dir', '?')).name}` (block {cfg.get('block_size')}, "
        f"{cfg.get('eval_windows')} held-out windows), on {dev.get('name', '?')} ({dev.get('type', '?')}); "
        "the clock: training seconds to the target."
    )


def slower_than_parent(sr: Speedrun, stage: str, parent: str, keeps_model: bool = False) -> str:
    """Where a stage trains slower than its parent, why it stands; "" where it is not slower.

    Within the spread of speed_0's own seeds (the same settings, another seed), the difference is not the stage's;
    beyond it, the stage is kept for what it gives instead: fewer tokens on the seed both trained, a shorter whole
    process, or its nature. A stage that keeps the model (`keeps_model`) is never kept for its tokens: where they
    differ from its parent's, it is in the last bits of one model's losses, between two evaluations."""
    ratio = sr.mean_seconds(parent) / sr.mean_seconds(stage)
    if ratio >= 1:
        return ""
    base = [s for s in sr.seconds(BASELINE) if s]
    spread = max(base) / min(base) if base else None
    if spread and 1 / ratio <= spread:
        return f" (slower, within the {spread:.2f}x that `{BASELINE}`'s seeds span)"
    if keeps_model:
        (mine, _), (theirs, _) = sr.walls(stage), sr.walls(parent)
        mine, theirs = (statistics.fmean(w) if w else None for w in (mine, theirs))
        if mine and theirs and mine < theirs:
            return f" (slower: kept for its whole process, {mine:.1f} s against {theirs:.1f})"
    else:
        mine, theirs = sr.tokens(stage)[0], sr.tokens(parent)[0]
        if mine is not None and theirs is not None and mine < theirs:
            return " (slower: kept for its tokens)"
    return " (slower: its docstring says what it is kept for)"


def stage_row(sr: Speedrun, stage: str, base: list[float | None]) -> list[str]:
    """One stage's row (not the baseline's): failed, missing, not held (its seeds' final losses) or its figures."""
    declared = declaration(stage)
    number, change = stage.split("_")[1], f"{declared.change} ({KINDS[declared.kind]})"
    records = sr.stages[stage]
    if not records:
        return [number, change, "not run", "", "", "", ""]
    failed = [r for r in records if not ok(r)]
    if failed:
        return [number, change, f"**{failed[0].get('status')}**: {failed[0].get('reason', '')}", "", "", "", ""]
    seconds = sr.seconds(stage)
    seeds = f"{sum(s is not None for s in seconds)}/{len(seconds)} seeds"
    if not sr.holds(stage):
        finals = ", ".join(f"{r['metrics']['val_loss_final']:.3f}" for r in records)
        return [number, change, f"not reached (final val loss {finals}); {seeds}", wall_cell(sr, stage), "", "",
                record_cell(sr, stage)]  # fmt: skip
    parent = parent_of(stage)
    vs_parent = ""
    if parent != BASELINE and sr.holds(parent):
        vs_parent = f"; {speedup_range(sr.seconds(parent), seconds)} vs parent" + slower_than_parent(
            sr, stage, parent, keeps_model=declared.kind == "systems"
        )
    return [
        number,
        change,
        f"{_spread(seconds)}; {seeds}",
        wall_cell(sr, stage),
        (speedup_range(base, seconds) if None not in base else "") + vs_parent,
        tokens_cell(sr, stage),
        record_cell(sr, stage),
    ]


def speedrun_table(sr: Speedrun) -> list[str]:
    """The record table, modded-nanogpt's way: the task in one line, then a row per stage."""
    base = sr.seconds(BASELINE)
    change = "baseline: its time-to-loss settings"
    if sr.holds(BASELINE):
        first = [f"{_spread(base)}; {len(base)}/{len(base)} seeds", wall_cell(sr, BASELINE), "1.00x"]
        first += [tokens_cell(sr, BASELINE), record_cell(sr, BASELINE)]
    else:  # no target without every seed of it: the stages' rows say whether they ran
        unfinished = next((r for r in sr.baseline if not ok(r)), None)
        status = "not run" if unfinished is None else f"**{unfinished.get('status')}**: {unfinished.get('reason', '')}"
        first = [status, "", "", "", ""]
    rows = [["0", change, *first]] + [stage_row(sr, stage, base) for stage in sr.stages]
    return [
        task_line(sr),
        "",
        *table(["#", "change", "training s", "wall s", f"x vs {BASELINE[:7]}", "tokens", "record"], rows),
    ]


def plot_speedrun(sr: Speedrun, path: Path) -> bool:
    """Validation loss against training seconds, every seed of speed_0 and each stage; False: nothing to plot."""
    lines = [(f"{BASELINE[:7]} seed {r.get('seed')}", r, "0.45") for r in sr.baseline if ok(r)]
    plt = pyplot()
    colors = plt.get_cmap("tab10").colors
    for i, (stage, records) in enumerate(sr.stages.items()):
        lines += [
            (f"{stage.replace('speedrun_', 'sr')} seed {r.get('seed')}", r, colors[i % len(colors)])
            for r in records
            if ok(r)
        ]
    if not any(label.startswith("sr") for label, _, _ in lines):
        return False
    fig, ax = plt.subplots(figsize=(10, 5.2))
    for label, r, color in lines:
        curve = r["metrics"]["curve"]
        ax.plot([p["seconds"] for p in curve], [p["val_loss"] for p in curve], color=color, lw=1.1, label=label)
    if sr.target is not None:
        ax.axhline(sr.target, color="black", ls="--", lw=0.8, label=f"target {sr.target:.3f} (speed_0's final loss)")
    ax.set_xlabel("training seconds (start-up and evaluations excluded)")
    ax.set_ylabel("validation loss")
    ax.set_ylim(top=min(ax.get_ylim()[1], 3.0))
    ax.set_title("Speedrun: validation loss against training seconds")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)
    return True


WATERFALL = "speedrun_waterfall.png"


def plot_waterfall(sr: Speedrun, path: Path) -> bool:
    """A waterfall of training seconds to the target: speed_0's, then each speedrun stage's change from its parent's.

    False where there is no baseline or no stage holds; else draw_waterfall's figure, written to `path`."""
    fig = draw_waterfall(sr)
    if fig is None:
        return False
    save_figure(fig, path, layout=False)
    return True


def draw_waterfall(sr: Speedrun):
    """The waterfall's figure, laid out: each bar labelled with its seconds and its factor against its parent.

    Two short lines a bar, so that twenty bars' labels never overlap (tests/test_report.py renders the committed
    run's and checks); the tokens and margins are the table's. None: no baseline or no stage holds."""
    held = [s for s in sr.stages if sr.holds(s)]
    if not sr.holds(BASELINE) or not held:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(12, 5.6))
    stages = [BASELINE, *sr.stages]
    top = sr.mean_seconds(BASELINE)
    level = top
    for i, stage in enumerate(stages):
        seconds = sr.mean_seconds(stage)
        if seconds is None:
            ax.text(i, level + 0.01 * top, "not\nreached" if sr.stages.get(stage) else "not\nrun", ha="center",
                    va="bottom", fontsize=7, color="tab:red")  # fmt: skip
            continue
        if stage in (BASELINE, held[-1]):  # the start and the end, whole
            ax.bar(i, seconds, color="0.35" if stage == BASELINE else "tab:blue", alpha=1 if stage == BASELINE else 0.5)
        if stage != BASELINE:  # the change, from its parent's level
            ax.bar(i, level - seconds, bottom=seconds, color="tab:green" if seconds <= level else "tab:red")
        parent = parent_of(stage) if stage != BASELINE else None
        factor = f"\n{sr.mean_seconds(parent) / seconds:.2f}x" if parent and sr.holds(parent) else ""
        ax.text(i, max(level, seconds) + 0.01 * top, f"{fmt_num(seconds)} s{factor}", ha="center", va="bottom",
                fontsize=7)  # fmt: skip
        if i:
            ax.plot([i - 1.4, i + 0.4], [level, level], color="0.6", lw=0.8, ls=":")
        level = seconds
    ax.set_xticks(range(len(stages)), [s.replace("speedrun_", "").replace("_", " ") for s in stages], rotation=20,
                  ha="right", fontsize=8)  # fmt: skip
    ax.set_xlim(-0.7, len(stages) - 0.3)  # the last bar's label inside too, "not run" or not
    ax.set_ylim(0, top * 1.15)
    ax.set_ylabel("training seconds to the target (mean over seeds)")
    ax.set_title(
        f"Speedrun waterfall: {BASELINE}'s training seconds to its model, change by change "
        f"({top / sr.mean_seconds(held[-1]):.2f}x to {held[-1]})\nabove each bar: its seconds, then its factor on "
        "its parent's",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def speedrun_findings(sr: Speedrun) -> list[str]:
    """The headline: the last stage whose claim holds, against the baseline, with its seeds."""
    base = sr.seconds(BASELINE)
    if None in base or not base:
        return [f"`{BASELINE}` has not finished all its seeds here: no speedup can be given."]
    held = [s for s in sr.stages if sr.holds(s)]
    if not held:
        return ["No speedrun stage reached the target on every seed."]
    last = held[-1]
    seconds = sr.seconds(last)
    walls, clock = sr.walls(last)
    base_walls, base_clock = sr.walls(BASELINE)
    whole = (
        f" Its whole process, as a user runs it, took {_spread(walls)} s of wall clock against "
        f"{_spread(base_walls)} s for `{BASELINE}`'s whole budget: {speedup_range(base_walls, walls)}."
        if walls and clock == base_clock
        else ""
    )
    findings = [
        f"`{last}` reaches `{BASELINE}`'s model (validation loss {sr.target:.3f}) in {_spread(seconds)} s of "
        f"training on each of its {len(seconds)} seed(s), against {_spread(base)} s for `{BASELINE}`'s "
        f"{len(base)} seeds: {speedup_range(base, seconds)} sooner.{whole}"
    ]
    fewest = min(held, key=sr.mean_seconds)
    if fewest != last:  # a later stage gave training seconds back for something else (the wall clock)
        findings.append(
            f"The fewest training seconds are `{fewest}`'s, {_spread(sr.seconds(fewest))} s "
            f"({speedup_range(base, sr.seconds(fewest))}); the stages after it gave some back, each for what its "
            "row says."
        )
    return findings


PEAK_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}  # the precisions whose CPU peaks machine.json holds


def floors_finding(sr: Speedrun) -> str | None:
    """The last stage that holds against its floors: tokens against the n-gram count, throughput against the peak.

    Tokens to the target against the fewest training characters with which a counted 5-gram reaches it
    (gpt/ngram_floor.py's record); tokens a second and the model FLOP/s they make against the fastest matmul peak
    measured at the stage's threads (machine.json, a CPU's: bf16's where the CPU has bf16 units, else fp32's, whose
    bf16 is emulated); and where its first seed's process spent its wall clock."""
    held = [s for s in sr.stages if sr.holds(s)]
    if not held:
        return None
    last, records = held[-1], sr.stages[held[-1]]
    parts = [f"`{last}` against its floors: {_spread(sr.tokens(last))} tokens to the target"]
    floor = sr.ngram_floor or {}
    if floor.get("reached_at") and floor.get("target_loss") == sr.target:
        below = max((n for n, loss in floor["prefixes"] if loss > sr.target), default=0)
        parts[0] += (
            f", where a counted {floor['order']}-gram reaches it from between {below:,} and {floor['reached_at']:,} "
            "training characters (`python -m gpt.ngram_floor`)"
        )
    rates = [r["metrics"]["tokens_per_s"] for r in records]
    threads = records[0].get("device", {}).get("threads_per_process")
    measured = sr.machine.get("cpu_peaks_gflops", {})
    labels = {peak_label(dt, threads): name for dt, name in PEAK_NAMES.items()}
    peaks = [(measured[label], name) for label, name in labels.items() if label in measured]
    peak, dtype = max(peaks, default=(None, None))
    flops = records[0].get("model", {}).get("flops_per_token")
    parts.append(f"{_spread(rates)} tokens a second")
    if peak and flops:
        achieved = [rate * flops / 1e9 for rate in rates]
        parts[-1] += (
            f", {_spread(achieved)} model GFLOP/s at {flops / 1e6:.1f} MFLOP a token: "
            f"{statistics.fmean(achieved) / peak:.0%} of the {fmt_num(peak)} GFLOP/s {dtype} "
            "matmul peak measured here, its fastest"
        )
    m = records[0]["metrics"]
    if split := process_split(m):
        parts.append(
            f"its seed {records[0]['seed']}'s process, {fmt_num(m['process_s'])} s: "
            + ", ".join(f"{what} {fmt_num(s)}" for what, s in split.items())
        )
    return "; ".join(parts) + "."


def speedrun_section(sr: Speedrun, plots: Path, rel: str) -> list[str]:
    """The whole section; [] when the run has no speedrun record."""
    if not sr.ran:
        return []
    lines = [
        "",
        "## Speedrun",
        "",
        f"The baseline's model, sooner: every stage trains from scratch on `{BASELINE}`'s time-to-loss settings "
        "with one change more than its parent, holds only if every seed it trained with reaches the target, and "
        "stops at its first evaluation at or below it (its curve ends there). Why the target is the worst seed's "
        "final loss, and the changes tried and dropped: docs/speedrun.md.",
        "",
    ]
    lines += speedrun_table(sr) + ["", columns_line("speedrun")]
    lines += [""] + [f"- {f}" for f in speedrun_findings(sr)]
    if floors := floors_finding(sr):
        lines.append(f"- {floors}")
    if plot_waterfall(sr, plots / WATERFALL):
        lines += ["", f"![speedrun waterfall: training seconds to the target, stage by stage]({rel}/{WATERFALL})"]
    if plot_speedrun(sr, plots / "speedrun.png"):
        lines += ["", f"![speedrun: validation loss against seconds]({rel}/speedrun.png)"]
    if sr.noise_scale:
        lines += noise_scale_lines(sr.noise_scale, plots, rel)
    return lines


def noise_scale_lines(record: dict, plots: Path, rel: str) -> list[str]:
    """The gradient noise scale measured along the baseline's run (gpt/noise_scale.py) and its plot."""
    from gpt.noise_scale import summary_line

    lines = ["", f"- {summary_line(record)}"]
    try:
        plot_noise_scale(record, plots / "noise_scale.png")
    except Exception as e:  # a plot never costs the report
        return lines + [f"- (the noise-scale plot failed: {e})"]
    return lines + ["", f"![gradient noise scale along speed_0's run]({rel}/noise_scale.png)"]


def plot_noise_scale(record: dict, path) -> None:
    """B_simple against training tokens, the validation loss on a twin axis, the window B_noise is read over shaded."""
    plt = pyplot()
    points = [p for p in record["curve"] if p["b_simple"] is not None]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    ax.plot(
        [p["tokens"] for p in points],
        [p["b_simple"] for p in points],
        "o-",
        color="tab:blue",
        label="B_simple (moving average)",
    )
    ax.axhline(record["batch_size"], color="black", lw=1, ls="--", label=f"baseline batch ({record['batch_size']})")
    window = record["window"]
    end = record["curve"][-1]["tokens"]
    ax.axvspan(window["from_tokens"], end, color="tab:blue", alpha=0.08, label="the window B_noise is read over")
    ax.hlines(
        window["b_noise"],
        window["from_tokens"],
        end,
        color="tab:blue",
        ls=":",
        label=f"B_noise = {window['b_noise']:.0f} (the window's means, then divided)",
    )
    ax.set_xlabel("training tokens")
    ax.set_ylabel("B_simple = tr(Σ) / |G|², samples")
    ax.set_ylim(bottom=0)
    loss_ax = ax.twinx()
    loss_ax.plot(
        [p["tokens"] for p in record["curve"]],
        [p["val_loss"] for p in record["curve"]],
        "-",
        color="tab:orange",
        label="validation loss",
    )
    loss_ax.set_ylabel("validation loss")
    lines = ax.get_legend_handles_labels()
    more = loss_ax.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("Gradient noise scale along speed_0's run to a loss")
    save_figure(fig, path)

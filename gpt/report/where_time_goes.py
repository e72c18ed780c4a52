"""Where the time goes: each stage's profiled breakdown against its parent's, on the shares its change acts on."""

import math
from pathlib import Path

from gpt import optimizations
from gpt.formatting import fmt_pct, fmt_share, fmt_time
from gpt.report.rows import Rung, comparable, display, ok, samples_label
from gpt.step_profiler import TIME_CATEGORIES, label

NO_GAIN_PCT = 3.0  # a stage that saves less than this (time or memory) "did not help here"
SMALL_SHARE_PCT = 5.0  # a change whose targets held less than this share of the parent's step had little to win
# The categories the timed repeats measure too (gpt/protocol.py): the tables' "data wait / copy" column
TIMED_KEYS = {"data": "data_wait_pct", "copy": "copy_pct"}


def shares(record: dict | None) -> dict | None:
    """The record's time breakdown: % of a profiled step's wall time per category, adding up to 100."""
    return record["metrics"].get("time_breakdown_pct") if ok(record) else None


def timed_shares(record: dict) -> dict:
    """The record's shares of the timed repeats' time, for the categories they measure (TIMED_KEYS)."""
    metrics = record["metrics"]
    return {c: metrics[key] for c, key in TIMED_KEYS.items() if metrics.get(key) is not None}


def seconds_by_category(record: dict) -> dict:
    """The timed seconds per N samples, split by the profiled shares."""
    return {c: record["metrics"]["seconds_mean"] * v / 100 for c, v in shares(record).items()}


def bottleneck(r: Rung) -> str:
    """The largest share of the stage's step, e.g. "backward 48%"."""
    b = shares(r.record)
    if not b:
        return ""
    top = max(b, key=b.get)
    return f"{label(top)} {fmt_share(b[top])}"


def noise_pct(r: Rung) -> float:
    """Run-to-run noise of the comparison with the parent: the two relative standard deviations combined."""
    cv = [rec["metrics"]["seconds_std"] / rec["metrics"]["seconds_mean"] for rec in (r.record, r.parent)]
    return 100 * math.hypot(*cv)


def within_noise(r: Rung, d: float) -> str:
    """A note when a time change `d` (%) is smaller than the comparison's run-to-run noise."""
    noise = noise_pct(r)
    return f", within run-to-run noise of ±{noise:.0f}%" if abs(d) < noise else ""


def stayed_small(r: Rung, category: str) -> bool:
    """Whether `category` held under SMALL_SHARE_PCT of the parent's step and still does here, by every measurement.

    The profiled step's shares, and for data wait and copy the timed repeats' too; its seconds must not have grown by
    NO_GAIN_PCT of the parent's time (the stage did not add it)."""
    seconds, parent_seconds = r.m("seconds_mean"), r.parent["metrics"]["seconds_mean"]
    for mine, parents in ((shares(r.record), shares(r.parent)), (timed_shares(r.record), timed_shares(r.parent))):
        if category not in mine and category not in parents:
            continue
        new, old = mine.get(category, 0.0), parents.get(category, 0.0)
        added_pct = (new * seconds - old * parent_seconds) / parent_seconds
        if max(new, old) >= SMALL_SHARE_PCT or added_pct >= NO_GAIN_PCT:
            return False
    return True


def time_line(r: Rung, time_goal: bool) -> str | None:
    """What the stage's change did to where the time goes: the shares it acts on, else the one that moved most."""
    b, pb = shares(r.record), shares(r.parent)
    if not b or not pb or not comparable(r.record, r.parent) or r.record.get("no_effect"):
        return None  # no breakdown to compare; or nothing changed on this device (no_effect_lines says why)
    t, pt = seconds_by_category(r.record), seconds_by_category(r.parent)
    cats = [c for c in TIME_CATEGORIES if c in b or c in pb]
    changed = optimizations.changed(r.parent.get("config", {}), r.record.get("config", {}))
    targets = [c for c in optimizations.time_targets(changed) if c in cats]
    biggest = max(cats, key=lambda c: abs(t.get(c, 0) - pt.get(c, 0)))
    d = r.vs(r.parent, "seconds_mean")
    head = f"`{r.stage}` ({fmt_pct(d)} time{within_noise(r, d)}"
    timed, parent_timed = timed_shares(r.record), timed_shares(r.parent)
    if time_goal and d > -NO_GAIN_PCT:
        if targets and all(stayed_small(r, c) for c in targets):
            was = " and ".join(f"{label(c)} was {fmt_share(pb.get(c, 0))}" for c in targets)
            also = [f"{label(c)} {fmt_share(parent_timed[c])}" for c in targets if c in parent_timed]
            also = f" ({' and '.join(also)} of its timed repeats)" if also else ""
            return (
                f"{head}, did not help): {was} of the parent's profiled step already{also}, and stayed small "
                "here, so there was little to remove"
            )
        head += ", did not help"

    def moved(c: str) -> str:
        repeats = (
            f"; timed repeats: {fmt_share(parent_timed[c])} -> {fmt_share(timed[c])}"
            if c in timed and c in parent_timed
            else ""
        )
        return (
            f"{label(c)} {fmt_share(pb.get(c, 0))} -> {fmt_share(b.get(c, 0))} "
            f"({fmt_time(pt.get(c, 0))} -> {fmt_time(t.get(c, 0))}{repeats})"
        )

    cited = targets or [biggest]
    return (
        f"{head}): "
        + ", ".join(map(moved, cited))
        + (f"; largest change: {moved(biggest)}" if biggest not in cited else "")
    )


def time_lines(rungs: list[Rung], time_goal: bool) -> list[str]:
    """Under a ladder's table: one line per stage from the breakdowns of the stage and of its parent."""
    lines = [time_line(r, time_goal) for r in rungs]
    lines = [ln for ln in lines if ln]
    if not lines:
        return []
    return [
        "",
        f"Where the time goes, stage by stage (share of a profiled step's wall time, then seconds per "
        f"{samples_label(rungs)} samples):",
        "",
    ] + [f"- {ln}" for ln in lines]


def time_section(runs: Path, ladders: dict[str, list[Rung]], rel: str) -> list[str]:
    """The section under the breakdown plot of every ladder: how the shares are measured, and where the traces are."""
    profiled = [r for rungs in ladders.values() for r in rungs if shares(r.record)]
    traces = [
        r.stage for r in profiled if r.m("profiler").get("trace") and (runs / r.m("profiler")["trace"]).is_file()
    ]  # a committed records folder keeps none
    steps = sorted({r.m("profiler")["steps"] for r in profiled})
    gpu = any("gpu_idle" in shares(r.record) for r in profiled)
    lines = [
        "",
        "## Where the time goes",
        "",
        f"After its timed repeats, each stage trains {' or '.join(map(str, steps))} more step(s) under "
        "`torch.profiler` (rank 0 of distributed stages). Every instant of those steps goes to one "
        "category, so the shares add up to 100%; the bars split each stage's timed seconds by them. "
        + (
            "On the GPU a category is what the GPU was doing (the phase that launched the running kernel); "
            "GPU idle is time with no kernel running while the host was neither waiting for data nor "
            "copying. "
            if gpu
            else "On the CPU a category is the phase the training thread was in. "
        )
        + "docs/measurement.md, 'Where the time goes', defines each one.",
        "",
        f"![where the time goes]({rel}/time_breakdown.png)",
    ]
    if traces:
        lines += [
            "",
            f"Traces: `{display(runs)}/<stage>.trace.json.gz` for {len(traces)} stage(s); open one in "
            "https://ui.perfetto.dev or chrome://tracing.",
        ]
    return lines

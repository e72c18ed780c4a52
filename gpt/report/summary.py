"""The summary at the top of results.md: a line per ladder, one for the time to loss, the speedrun's findings."""

from gpt.formatting import fmt_num, fmt_pct
from gpt.ladder import LADDERS, parent_of
from gpt.report.findings import changes
from gpt.report.rows import Rung
from gpt.report.speedrun import Speedrun, speedrun_findings
from gpt.report.tables import ANCHOR, anchor_change
from gpt.report.time_to_loss import BASELINE, LossRuns, speedup


def largest_documented(rungs: list[Rung], key: str) -> str:
    """The documented run's largest change on this ladder (the anchor's where the book has none), or ''."""
    documented = [(r, d) for r in rungs if (d := r.ref_vs(key, r.parent_reference)) is not None]
    source = "the documented H100 run"
    if not documented and key == "seconds":
        documented, source = [(r, d) for r in rungs if (d := anchor_change(r)) is not None], ANCHOR
    if not documented:
        return "no documented figures"
    best, d = min(documented, key=lambda x: x[1])
    return f"in {source}: `{best.stage}`, {fmt_pct(d)}"


def ladder_line(name: str, rungs: list[Rung]) -> str:
    time_goal = LADDERS[name].goal == "time"
    key, ref_key, what = (
        ("seconds_mean", "seconds", "time") if time_goal else ("peak_memory_mib", "peak_mib", "peak memory")
    )
    steps = changes(rungs, key)
    if not steps:
        here = "no stage finished beside its parent here"
    else:
        best, d = min(steps, key=lambda x: x[1])
        here = f"here `{best.stage}` ({best.change}), {fmt_pct(d)} {what}"
    done = sum(r.ok for r in rungs)
    finished = "" if done == len(rungs) else f" ({done} of {len(rungs)} stages finished)"
    return (
        f"**{name.capitalize()} ladder**{finished}, largest {'gain' if time_goal else 'saving'}: {here}; "
        f"{largest_documented(rungs, ref_key)}."
    )


def loss_sentence(runs: LossRuns) -> str | None:
    """What training to a loss found, in one sentence (no final stop).

    None without a finished baseline, or without a stage to set beside it (a speedrun-only run trains the baseline
    alone, for the speedrun's target)."""
    base = runs.to_target(BASELINE)
    others = [s for s in runs.stages if s != BASELINE and runs.records.get(s)]
    if not base or not others:
        return None
    sooner = {s: t["seconds"] for s in others if (t := runs.to_target(s)) and t["seconds"] < base["seconds"]}
    if sooner:
        best = min(sooner, key=sooner.get)
        return (
            f"{len(sooner)} of {len(others)} stages reach `{BASELINE}`'s target loss ({runs.target:.3f}) "
            f"sooner than it does; the soonest, `{best}`, {speedup(base['seconds'], sooner[best])} as fast"
        )
    text = (
        f"no stage reaches `{BASELINE}`'s target loss ({runs.target:.3f}) sooner than it does "
        f"({fmt_num(base['seconds'])} s)"
    )
    kept = runs.kept_models()
    if not kept:
        return text
    first = kept[0]
    keeping = [s for s in runs.stages if runs.kept_model(s) == first and not runs.changes(s) and runs.vs(s, first)[1]]
    text += (
        f": `{first}` trains another model (its final loss {runs.final(first):.3f} against its parent's "
        f"{runs.final(parent_of(first)):.3f}) and the stages after it keep that model"
    )
    if keeping:
        theirs, mine = runs.vs(keeping[-1], first)
        text += (
            f"; the last of those, `{keeping[-1]}`, reaches that model's loss {speedup(theirs, mine)} as fast as "
            f"`{first}`"
        )
    return text + ", so the per-sample speedups buy that model sooner, not the baseline's"


def summary(ladders: dict[str, list[Rung]], runs: LossRuns, speedrun: Speedrun) -> list[str]:
    lines = [f"- {ladder_line(name, rungs)}" for name, rungs in ladders.items()]
    sentence = loss_sentence(runs)
    if sentence:
        lines.append(f"- **Time to loss**: {sentence[0].upper() + sentence[1:]}.")
    if speedrun.ran:
        lines += [f"- **Speedrun**: {finding}" for finding in speedrun_findings(speedrun)]
    return ["", "## Summary", "", *lines] if lines else []

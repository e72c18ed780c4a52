"""results.md from the JSON records of a ladder run, section by section (the sections: docs/measurement.md).

Everything here is derived from the records (and the stage scripts' CHANGE / REFERENCE), so the report of a partial
run is as correct as that of a full one. Every table has at most MAX_COLUMNS columns.
"""

import os
import re
from pathlib import Path

from gpt.committed_records import NOTE
from gpt.data import REPO_ROOT
from gpt.errors import UserError
from gpt.files import write_atomically
from gpt.ladder import LADDERS, ladder_of
from gpt.records import read_record
from gpt.report.figures import machines_section, plot_thesis, speedrun_machines_lines, thesis_lines
from gpt.report.findings import memory_findings, method_notes, noise_line, speed_findings
from gpt.report.memory_planner import planner_section
from gpt.report.plots import plot_memory, plot_speed, plot_time_breakdown, plot_timelines
from gpt.report.rows import Rung, ladders_of, load_records
from gpt.report.speedrun import Speedrun, speedrun_section
from gpt.report.summary import summary
from gpt.report.tables import header, ladder_intro, memory_table, speed_table, title
from gpt.report.time_to_loss import LossRuns, loss_section
from gpt.report.where_time_goes import time_lines, time_section

PLOTS = "plots"  # the plots' folder beside results.md, as its links name it
MAX_COLUMNS = 7  # the widest table the page may hold (tests/test_report.py checks the whole page)
# Links into the repo (docs, code notes, records) are written relative to its root, then to the page's folder.
REPO_LINK = re.compile(r"\]\(((?:docs|gpt|records)/[^)\s#]*|results\.md)((?:#[^)\s]*)?)\)")  # results.md: the root's


def write_report(runs: Path, out: Path | None = None) -> Path:
    """Regenerate results.md (default: inside `runs`) and its plots/ from the records in `runs`."""
    runs = Path(runs)
    out = Path(out) if out else runs / "results.md"
    records, to_a_loss, speedrun = load_records(runs), LossRuns(runs), Speedrun(runs)
    if not records and not to_a_loss.records and not speedrun.ran:
        raise UserError(f"no stage records in {runs} (run ./run_all.sh or a stage script first)")
    plots = out.parent / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    lines = title(runs)
    ladders = ladders_of(records)
    lines += summary(ladders, to_a_loss, speedrun)
    lines += header(
        runs,
        {
            **{f"{s} (to a loss)": r for s, r in to_a_loss.records.items()},
            **{f"{s} (speedrun)": runs_[0] for s, runs_ in speedrun.stages.items() if runs_},
            **records,
        },
    )
    lines += provenance(runs)
    lines += quick_note(
        runs,
        [*records.values(), *to_a_loss.records.values(), *(r for runs_ in speedrun.stages.values() for r in runs_)],
    )
    drawn_in = folded(ladders)
    for name, rungs in ladders.items():
        more = [r for other, host in drawn_in.items() if host == name for r in ladders[other]]
        lines += ladder_section(name, rungs, runs, plots, more, drawn_in.get(name))
    if plot_time_breakdown(ladders, plots / "time_breakdown.png"):
        lines += time_section(runs, ladders, PLOTS)
    lines += machines_section(runs, plots, PLOTS)
    lines += loss_section(to_a_loss, plots, PLOTS, records)
    if plot_thesis(to_a_loss, speedrun, plots / "thesis.png"):
        lines += thesis_lines(PLOTS)
    lines += speedrun_section(speedrun, plots, PLOTS)
    if speedrun.ran:
        lines += speedrun_machines_lines(runs)
    planner = planner_section(runs, plots, PLOTS)
    if planner:
        lines += [""] + planner
    write_atomically(out, relink("\n".join(lines) + "\n", out.parent))
    return out


def relink(text: str, folder: Path) -> str:
    """The page's links into the repo (written relative to its root) made relative to the folder the page is in."""

    def move(m: re.Match) -> str:
        return f"]({Path(os.path.relpath(REPO_ROOT / m[1], folder)).as_posix()}{m[2]})"

    return REPO_LINK.sub(move, text)


def folded(ladders: dict[str, list[Rung]]) -> dict[str, str]:
    """Ladder -> the ladder whose figures draw it.

    A memory ladder that continues from another memory ladder of this run (lean from memory_4) is drawn
    after it, in its figures, rather than in figures of its own."""
    return {
        name: host
        for name in ladders
        if (start := LADDERS[name].starts_from)
        and (host := ladder_of(start)) in ladders
        and LADDERS[name].goal == LADDERS[host].goal == "memory"
        and any(r.ok for r in ladders[host])  # the host draws figures
    }


def provenance(runs: Path) -> list[str]:
    """The records folder's own note (gpt/committed_records.py: NOTE), e.g. that older code made them."""
    note = runs / NOTE
    return ["", note.read_text().strip()] if note.is_file() else []


def quick_note(runs: Path, records: list[dict]) -> list[str]:
    """What a quick run (`./run_all.sh --quick`, gpt/quick_run.py) left out, and its GPU tests' closing line."""
    quick = [r for r in records if (r or {}).get("run", {}).get("quick")]
    if not quick:
        return []
    timed = [r["config"] for r in quick if r.get("mode") != "time_to_loss" and r.get("status") == "ok"]
    repeats = "/".join(sorted({str(c["repeats"]) for c in timed}))
    warmup = "/".join(sorted({str(c["warmup_iters"]) for c in timed}))
    note = (
        "**A quick run** (`./run_all.sh --quick`): a first look, within a time limit"
        + (f"; each timed stage ran {repeats} repeats after {warmup} warm-up steps" if timed else "")
        + "; speed_0 and each speedrun stage train one seed, and the noise scale is not measured. Stages the "
        "limit left no room for say so below. A full `./run_all.sh` gives the steadier figures."
    )
    tests = read_record(runs / "gpu_tests.json")
    if tests:
        note += f" The one-GPU tests (`{tests['command']}`, {tests['seconds']:.0f} s): {tests['summary']}."
    return ["", note]


def ladder_section(
    name: str, rungs: list[Rung], runs: Path, plots: Path, more: list[Rung] = (), drawn_in: str | None = None
) -> list[str]:
    """One ladder: its tables, findings, where the time goes stage by stage, and its plots.

    The plots also draw `more` (the stages of a ladder that continues from this one). A ladder `drawn_in` another's
    figures links to them instead."""
    done, time_goal = sum(r.ok for r in rungs), LADDERS[name].goal == "time"
    title = f"{name.capitalize()} ladder"
    lines = ["", f"## {title}", "", f"{done} of {len(rungs)} stages finished. " + ladder_intro(name, rungs), ""]
    lines += speed_table(rungs) if time_goal else memory_table(rungs)
    findings = speed_findings(rungs) if time_goal else memory_findings(rungs)
    notes = findings + noise_line(rungs) + method_notes(rungs, not time_goal, runs)
    lines += [""] + [f"- {f}" for f in notes]
    lines += time_lines(rungs, time_goal)
    if not done:
        return lines
    if drawn_in:
        return lines + [
            "",
            f"Its stages are drawn in the {drawn_in} ladder's figures, after `{LADDERS[name].starts_from}`: "
            f"[{PLOTS}/{drawn_in}.png]({PLOTS}/{drawn_in}.png).",
        ]
    shown = [*rungs, *more]
    if more:
        title += " and " + " and ".join(dict.fromkeys(f"{ladder_of(r.stage)} ladder" for r in more))
    (plot_speed if time_goal else plot_memory)(shown, plots / f"{name}.png", title)
    lines += ["", f"![{title.lower()}]({PLOTS}/{name}.png)"]
    if not time_goal and plot_timelines(shown, plots / f"{name}_timeline.png"):
        lines += ["", f"![memory over one step]({PLOTS}/{name}_timeline.png)"]
    return lines

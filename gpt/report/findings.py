"""The report's findings under each ladder's table, all read from the records.

Why a stage did not help (its optimization's own measured reason: gpt/optimizations), noisy timings, compilation's
cost, and how the figures were measured."""

import math
from pathlib import Path

from gpt import optimizations
from gpt.formatting import fmt_mib, fmt_pct, fmt_time, steady_steps
from gpt.peak_memory import MEMORY_METHODS
from gpt.records import ran_eager
from gpt.report.rows import SHOWN_MEMORY_PARTS, Rung, comparable, ok
from gpt.report.where_time_goes import NO_GAIN_PCT, noise_pct, time_line, within_noise

NOISY_PCT = 10.0  # repeats whose standard deviation exceeds this share of their mean are flagged


def changed(r: Rung) -> list:
    """The optimizations this stage changed against its parent's run (gpt/optimizations)."""
    return optimizations.changed(r.parent.get("config", {}), r.record.get("config", {}))


def why_no_speedup(r: Rung) -> str:
    """Why a speed stage did not help: its optimization's own reason (no_speedup), else how the steady step compares."""
    return optimizations.no_speedup(changed(r), r.record, r.parent) or steady_steps(r.record, r.parent)


def why_no_memory_saving(r: Rung) -> str:
    """Why a memory stage did not lower the peak: what dominates it, what moved, and what the change acts on."""
    b, pb = r.record["metrics"].get("memory_breakdown_mib"), r.parent["metrics"].get("memory_breakdown_mib")
    if not b or not pb:
        return "no breakdown recorded"
    parts = {k: b.get(k, 0) for k in SHOWN_MEMORY_PARTS}
    top = max(parts, key=parts.get)
    share = f"the peak is {parts[top] / b['total']:.0%} {top.replace('_', ' ')} ({fmt_mib(parts[top])} MiB)"
    moved = [k for k in SHOWN_MEMORY_PARTS if abs(b.get(k, 0) - pb.get(k, 0)) > 0.01 * b["total"]]
    targets = [k for opt in changed(r) for k in opt.memory_targets if k in SHOWN_MEMORY_PARTS]
    aimed = (
        (
            "; it acts on "
            + ", ".join(
                f"{k.replace('_', ' ')} ({fmt_mib(pb.get(k, 0))} MiB at the previous peak)"
                for k in dict.fromkeys(targets)
            )
        )
        if targets
        else ""
    )
    if not moved:
        return (
            f"what was alive at the peak is unchanged, so the memory this change saves is not held at the "
            f"peak moment ({share}){aimed}"
        )
    changes = ", ".join(f"{k.replace('_', ' ')} {fmt_mib(pb.get(k, 0))} -> {fmt_mib(b.get(k, 0))} MiB" for k in moved)
    return f"{share}; at the peak: {changes}{aimed}"


def changes(rungs: list[Rung], key: str) -> list[tuple[Rung, float]]:
    """Each stage's change of metric `key` against its parent, in %, where the two are comparable."""
    return [(r, d) for r, d in ((r, r.vs(r.parent, key)) for r in rungs) if d is not None]


def speed_findings(rungs: list[Rung]) -> list[str]:
    """What the speed tables do not show: the stages that did not help and why, and compilation's cost."""
    steps = changes(rungs, "seconds_mean")
    lines = []
    for r, d in steps:
        if d > -NO_GAIN_PCT and not r.record.get("no_effect") and not time_line(r, time_goal=True):
            lines.append(f"`{r.stage}` did not help here ({fmt_pct(d)}{within_noise(r, d)}): {why_no_speedup(r)}.")
    # the stage that switched compilation on (later stages pay it again in their warm-up)
    compiled = next(
        (
            r
            for r in rungs
            if r.ok and r.m("compile_s") is not None and not (ok(r.parent) and r.parent["choices"].get("compile_mode"))
        ),
        None,
    )
    if compiled:
        lines.append(compile_line(compiled))
    lines += [
        f"Warning: `{r.stage}` had torch.compile on, but its profiled step ran no compiled graph: its "
        "timed steps probably ran eager."
        for r in rungs
        if ran_eager(r.record)
    ]
    return lines + no_effect_lines(rungs)


def no_effect_lines(rungs: list[Rung]) -> list[str]:
    """Stages whose change does nothing here: the reason, and why the time change can exceed the repeats' spread."""
    lines = []
    for r in (r for r in rungs if r.ok and r.record.get("no_effect")):
        d = r.vs(r.parent, "seconds_mean")
        change = "" if d is None else f" ({fmt_pct(d)})"
        beyond = (
            ""
            if d is None or abs(d) <= noise_pct(r)
            else (
                f", though larger than the ±{noise_pct(r):.0f}% spread of the two stages' repeats: "
                "each stage's repeats run back to back, while the load of the machine and the processes before it "
                "change from stage to stage"
            )
        )
        lines.append(f"`{r.stage}`: {r.record['no_effect']}; its time change{change} is run-to-run variation{beyond}.")
    return lines


def compile_line(r: Rung) -> str:
    """torch.compile's one-time cost, apart from the steady state, and when it pays for itself."""
    cache = {
        "warm": "graphs loaded from the on-disk compile cache an earlier run filled; a first compile "
        "on a new machine takes longer",
        "partly warm": "some graphs loaded from the on-disk compile cache an earlier run filled",
        "cold": "compiled from scratch: the compile cache was empty",
    }.get(r.m("compile_cache"))
    text = (
        f"Compilation (`{r.stage}`): the first step took {fmt_time(r.m('first_step_s'))}, "
        f"its start-up steps {fmt_time(r.m('compile_s'))} more than steady ones"
        + (f" ({cache})" if cache else "")
        + "; it is not in the timed repeats."
    )
    if comparable(r.record, r.parent):  # speed_findings passes the stage whose parent ran uncompiled
        saved = r.parent["metrics"]["seconds_mean"] - r.m("seconds_mean")
        if saved > 0:
            text += (
                f" At {fmt_time(saved)} saved per {r.m('samples_per_repeat'):,} samples it pays for "
                f"itself after {math.ceil(r.m('compile_s') / saved):,} such repeats."
            )
        else:
            text += " The steady state was not faster, so here it never pays for itself."
    return text


def memory_findings(rungs: list[Rung]) -> list[str]:
    """Stages that did not lower the peak and why (the largest saving is the summary's, the rest the table's)."""
    steps = changes(rungs, "peak_memory_mib")
    lines = []
    for r, d in steps:
        if d > -NO_GAIN_PCT and not r.record.get("no_effect"):
            lines.append(f"`{r.stage}` did not lower the peak here ({fmt_pct(d)}): {why_no_memory_saving(r)}.")
    return lines + no_effect_lines(rungs)


def noise_line(rungs: list[Rung]) -> list[str]:
    """Stages whose repeats disagree: their time changes say more about the machine than the change."""
    noisy = [(r, 100 * r.m("seconds_std") / r.m("seconds_mean")) for r in rungs if r.ok]
    noisy = [f"`{r.stage}` (±{cv:.0f}%)" for r, cv in noisy if cv > NOISY_PCT]
    if not noisy:
        return []
    return [
        f"Noisy timing: the repeats of {', '.join(noisy)} differ by more than {NOISY_PCT:.0f}% of their "
        "mean (a busy machine, or repeats too short); rerun those stages before trusting their time "
        "changes."
    ]


def method_notes(rungs: list[Rung], memory_vs_baseline: bool, runs: Path | None = None) -> list[str]:
    """How peak memory and MFU were measured, once per distinct method, and where the allocator snapshots are.

    Also which memory changes shown (against the parent, and the baseline if `memory_vs_baseline`) compare stages
    measured differently; the snapshots named are those in `runs`."""
    done = [r for r in rungs if r.ok]
    memory = sorted({MEMORY_METHODS.get(m, m) for m in (r.record["choices"]["memory_method"] for r in done)})
    notes = [f"Peak memory: {'; '.join(memory)}."] if memory else []
    for r in done:
        compared = (r.parent, r.baseline) if memory_vs_baseline else (r.parent,)
        for other in {id(o): o for o in compared if o}.values():
            basis = r.memory_basis(other)
            if basis:
                methods = r.record["choices"]["memory_method"], other["choices"]["memory_method"]
            if basis == "reserved":
                notes.append(
                    f"† `{r.stage}` measures peak memory as {methods[0]}, `{other['stage']}` as "
                    f"{methods[1]}: their change compares the max_memory_reserved of both."
                )
            elif basis == "none":
                notes.append(
                    f"`{r.stage}` ({methods[0]}) and `{other['stage']}` ({methods[1]}) measure peak "
                    "memory differently and share no figure, so no memory change is given between them."
                )
    flops = sorted({r.m("peak_flops_source") for r in done if r.m("peak_flops_per_device")})
    unknown = sorted({r.m("peak_flops_source") for r in done if not r.m("peak_flops_per_device")} - {None})
    notes += [f"MFU is against the device's peak FLOPS, {'; '.join(flops)}."] if flops else []
    notes += [f"No MFU: {u}." for u in unknown]
    snapshots = [
        f"`{r.m('memory_snapshot')}`"
        for r in done
        if r.m("memory_snapshot") and (runs is None or (runs / r.m("memory_snapshot")).is_file())
    ]
    if snapshots:
        notes.append(
            f"The CUDA allocator's record of one training step, beside the records (open at "
            f"https://pytorch.org/memory_viz): {', '.join(snapshots)}."
        )
    return notes

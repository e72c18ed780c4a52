"""results.md from the JSON records of a ladder run: tables, generated findings and plots.

    python -m gpt.report [--runs runs/cpu-cpu] [--out runs/cpu-cpu/results.md]

Everything here is derived from the records (and the stage scripts' CHANGE / REFERENCE), so the report of a
partial run (one ladder, a failed stage, stages not run yet) is as correct as that of a full one. Plots are
PNGs in `plots/` beside results.md. If the records directory also holds the memory planner's outputs
(memory_reference.json, memory_fit.json, memory_compare.json, from gpt/memory.py) they get a section too.
"""
import argparse
import functools
import math
from datetime import datetime
from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.errors import UserError, exit_on_user_error
from gpt.ladder import LADDER_GOAL, LADDERS, STARTS_FROM, lineage, load_stage, parent_of, record_path
from gpt.peak_memory import MEMORY_METHODS
from gpt.profiling import CATEGORIES, label
from gpt.records import peak_memory_pair, ran_eager, read_record

MACHINE_FILE = "machine.json"  # written by run_all (gpt/run_ladder.py): the machine the ladder ran on
BREAKDOWN = ["parameters", "gradients", "optimizer_state", "activations", "temporaries"]  # + "other"
NO_GAIN_PCT = 3.0  # a stage that saves less than this (time or memory) "did not help here"
NOISY_PCT = 10.0  # repeats whose standard deviation exceeds this share of their mean are flagged
# Where the anchor figures of the ladders beyond the book come from (their stage scripts' ms_per_step).
ANCHOR = "build-nanogpt"
ANCHOR_SETUP = "karpathy/build-nanogpt: GPT-2 124M, batch 16 x 1024 tokens, one data-centre GPU, ms per step"


# ---------------------------------------------------------------------------------------------------------
# reading


def load_records(runs: Path) -> dict[str, dict]:
    """Stage name -> record, for the stages of every ladder that have a record in `runs`."""
    found = {}
    for stage in (s for stages in LADDERS.values() for s in stages):
        record = read_record(record_path(runs, stage))
        if record is not None:
            found[stage] = record
    return found


def ok(record: dict | None) -> bool:
    return bool(record) and record.get("status") == "ok"


def pct(new: float | None, old: float | None) -> float | None:
    """Relative change in percent, None when either side is missing."""
    if new is None or not old:
        return None
    return 100 * (new / old - 1)


def comparable(a: dict | None, b: dict | None) -> bool:
    """Two finished records measured under the same profile on the same kind of device."""
    return ok(a) and ok(b) and a["profile"] == b["profile"] and a["device"]["type"] == b["device"]["type"]


class Rung:
    """One stage of a ladder as the report sees it: the record (or None), its parent (for the first stage of
    a ladder beyond the book: the stage it continues from), the baseline of its lineage (speed_0 or
    memory_0), and what the stage script documents."""

    def __init__(self, stage: str, records: dict[str, dict], script):
        parent, first = parent_of(stage), lineage(stage)[0]
        self.stage, self.change, self.reference = stage, script(stage).CHANGE, script(stage).REFERENCE
        self.record = records.get(stage)
        self.parent_stage, self.baseline_stage = parent, (first if parent else None)
        self.parent = records.get(parent) if parent else None
        self.baseline = records.get(first) if parent else None
        self.parent_reference = script(parent).REFERENCE if parent else None
        self.baseline_reference = script(first).REFERENCE if parent else None

    @property
    def ok(self) -> bool:
        return ok(self.record)

    def m(self, key: str):
        return self.record["metrics"].get(key) if self.ok else None

    def vs(self, other: dict | None, key: str) -> float | None:
        """Change of metric `key` against another record, if the two are comparable. Peak memory is compared
        only as measured alike (see memory_basis)."""
        if not comparable(self.record, other):
            return None
        if key == "peak_memory_mib":
            return pct(*peak_memory_pair(self.record, other)[:2])
        return pct(self.m(key), other["metrics"].get(key))

    def memory_basis(self, other: dict | None) -> str | None:
        """None when this stage's peak memory and `other`'s were measured by the same method; else 'reserved'
        (the change compares both stages' max_memory_reserved) or 'none' (no figure in common: no change)."""
        if not comparable(self.record, other):
            return None
        basis = peak_memory_pair(self.record, other)[2]
        return None if basis == "same" else basis

    def memory_vs(self, other: dict | None) -> str:
        """The 'vs' cell of peak memory; marked with † when it compares max_memory_reserved (see method_notes)."""
        return fmt_pct(self.vs(other, "peak_memory_mib")) + (" †" if self.memory_basis(other) == "reserved" else "")

    def ref_vs(self, key: str, other: dict | None) -> float | None:
        return pct(self.reference.get(key), (other or {}).get(key))

    def status_text(self) -> str:
        if self.record is None:
            return "not run"
        status = self.record.get("status", "?")
        label = {"oom": "OOM"}.get(status, status)
        reason = self.record.get("reason")
        return f"**{label}**: {reason}" if reason else f"**{label}**"


def ladders_of(records: dict[str, dict]) -> dict[str, list[Rung]]:
    """The ladders that have at least one record, each as its full list of rungs (missing stages too)."""
    ladders, script = {}, functools.cache(load_stage)  # a stage script's CHANGE and REFERENCE
    for name, stages in LADDERS.items():
        if any(s in records for s in stages):
            ladders[name] = [Rung(s, records, script) for s in stages]
    return ladders


# ---------------------------------------------------------------------------------------------------------
# formatting


def fmt_pct(x: float | None) -> str:
    return "" if x is None else f"{x:+.0f}%" if abs(round(x, 1)) >= 10 else f"{x:+.1f}%"


def fmt_num(x: float | None, digits: int = 3) -> str:
    """`digits` significant figures, no exponent for everyday magnitudes."""
    if x is None:
        return ""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{decimals}f}"


def fmt_mib(x: float | None) -> str:
    return "" if x is None else f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:,.2f}"


def fmt_time(seconds: float | None) -> str:
    """Seconds for a person: 850 ms, 4.2 s, 3 min 12 s."""
    if seconds is None:
        return ""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def samples_label(rungs: list[Rung]) -> str:
    """'N' of 'seconds per N samples': the ladder's samples per repeat, if all its runs agree."""
    counts = {r.m("samples_per_repeat") for r in rungs if r.ok}
    return f"{counts.pop():,}" if len(counts) == 1 else "N"


# ---------------------------------------------------------------------------------------------------------
# the report's parts


def header(runs: Path, records: dict[str, dict]) -> list[str]:
    """Where and when the records were measured, from machine.json (run_all) and the records themselves."""
    machine = read_record(runs / MACHINE_FILE) or {}
    finished = [r for r in records.values() if ok(r)]
    envs = [r.get("env", {}) for r in records.values()]

    devices = sorted({f"{r['device']['name']} ({r['device']['type']})" for r in finished})
    processes = sorted({r["device"]["count"] for r in finished})
    threads = sorted({r["device"].get("threads_per_process") for r in finished} - {None})
    times = sorted(e["time"] for e in envs if e.get("time"))
    commits = sorted({e.get("git_commit", "unknown") for e in envs})
    torches = sorted({e.get("torch", "?") for e in envs})
    cudas = sorted({str(e.get("cuda")) for e in envs} - {"None"})
    profiles = sorted({r.get("profile", "?") for r in records.values()})

    def when(iso: str) -> str:
        return datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M UTC")

    cpus = machine.get("cpu_count", "not recorded")
    gpus = machine.get("gpus")
    gpu_text = "none" if gpus == [] else ", ".join(gpus) if gpus else "not recorded"
    rows = [
        ["device", ", ".join(devices) or "(no finished stage)"],
        ["processes per stage", " or ".join(map(str, processes)) + (
            f" ({' or '.join(map(str, threads))} CPU threads each)" if threads else "")],
        ["CPU cores / GPUs", f"{cpus} / {gpu_text}" + (
            f" (load average {machine['load_average']} when the ladder started)" if "load_average" in machine
            else "")],
        ["torch", ", ".join(torches) + (f" (CUDA {', '.join(cudas)})" if cudas else "")],
        ["python", machine.get("python") or ", ".join(sorted({e.get("python", "?") for e in envs}))],
        ["date", f"{when(times[0])} to {when(times[-1])}" if times else "unknown"],
        ["git commit", ", ".join(c[:12] + (" (uncommitted changes)" if c.endswith("-dirty") else "")
                                 for c in commits)],
        ["profile", ", ".join(profiles)],
    ]
    peaks, end = machine.get("cpu_peaks_gflops"), machine.get("cpu_peak_end_gflops") or {}
    if peaks:
        rows.append(["CPU matmul peaks (MFU basis)", "; ".join(f"{k}: {v:,.1f} GFLOP/s" for k, v in peaks.items())
                     + f" (measured before the first stage, best of {machine.get('cpu_peak_rounds', '?')} rounds)"
                     + "".join(f"; {k} after the last stage: {v:,.1f}" for k, v in end.items())])
    lines = [
        "# Results",
        "",
        f"Generated by `python -m gpt.report` from the JSON records in `{display(runs)}`. "
        "Regenerate it rather than editing it.",
        "",
        *table(["", ""], rows),
    ]
    if machine.get("load_average", 0) > 0.5 * (machine.get("cpu_count") or 1):
        lines += ["", f"Warning: the machine was busy when the ladder started (load average "
                      f"{machine['load_average']} on {machine['cpu_count']} cores). Other processes slow CPU "
                      "stages down unevenly, so the time columns are unreliable; memory figures are not affected."]
    for key, after in end.items():
        if peaks and key in peaks and after > 1.05 * peaks[key]:
            lines += ["", f"Warning: this CPU multiplied matrices {after / peaks[key] - 1:.0%} faster after the last "
                          f"stage than before the first ({key}: {peaks[key]:,.1f} -> {after:,.1f} GFLOP/s): the "
                          "host was busier at the start, and MFU figures against that peak are that much too high."]
    if len(profiles) > 1:
        lines += ["", f"Warning: these records come from {len(profiles)} profiles; changes are only computed "
                      "between stages of the same profile."]
    return lines


def reference_kind(rungs: list[Rung]) -> str | None:
    """'documented' (the book's H100 figures), 'anchor' (build-nanogpt's ms per step for some stages of a
    ladder beyond the book) or None (nothing to compare with)."""
    if any("seconds" in r.reference for r in rungs):
        return "documented"
    return "anchor" if any("ms_per_step" in r.reference for r in rungs) else None


def anchor_change(r: Rung) -> float | None:
    """The anchor's change for this stage's optimization, in %: its ms per step against the step before it."""
    return pct(r.reference.get("ms_per_step"), r.reference.get("parent_ms_per_step"))


def anchor_cell(r: Rung) -> str:
    return "" if anchor_change(r) is None else f"{r.reference['ms_per_step']} ({fmt_pct(anchor_change(r))})"


def reference_change(r: Rung, key: str) -> str:
    """' (reference: -33%)' or ' (build-nanogpt: -26%)' after a change of this run, or '' without a figure."""
    documented = r.ref_vs(key, r.parent_reference)
    if documented is not None:
        return f" (reference: {fmt_pct(documented)})"
    return f" ({ANCHOR}: {fmt_pct(anchor_change(r))})" if key == "seconds" and anchor_change(r) is not None else ""


def mfu_cell(r: Rung) -> str:
    """MFU against the peak of the stage's own dtype / against the device's fastest peak."""
    own, fastest = r.m("mfu_pct"), r.m("mfu_fastest_pct")
    if own is None:
        return ""
    return f"{own:.1f}%" + ("" if fastest is None else f" / {fastest:.1f}%")


def vs_previous_cell(r: Rung, key: str) -> str:
    cell = r.memory_vs(r.parent) if key == "peak_memory_mib" else fmt_pct(r.vs(r.parent, key))
    return cell + (" (no effect)" if cell and r.record.get("no_effect") else "")


def reference_cell(r: Rung, key: str, fmt=str) -> str:
    """The documented figure and its change against the parent's (empty for a stage without one)."""
    if r.reference.get(key) is None:
        return ""
    vs = r.ref_vs(key, r.parent_reference)
    return fmt(r.reference[key]) + (f" ({fmt_pct(vs)})" if vs is not None else "")


def feed_cell(r: Rung) -> str:
    """Data wait (the DataLoader) / copy (host to device): two different waits, see README."""
    copy = r.m("copy_pct")
    return f"{r.m('data_wait_pct'):.0f}%" + ("" if copy is None else f" / {fmt_share(copy)}")


def speed_table(rungs: list[Rung]) -> list[str]:
    n, kind = samples_label(rungs), reference_kind(rungs)
    refs = {"documented": [("reference s (vs prev.)", lambda r: reference_cell(r, "seconds"))],
            "anchor": [(f"{ANCHOR} ms/step (vs prev.)", anchor_cell)]}.get(kind, [])
    head = ["stage", "change", f"s / {n} samples", "vs previous", "vs baseline", *(h for h, _ in refs),
            "tokens/s", "peak MiB", "MiB vs prev.", "MFU (own dtype / fastest)", "data wait / copy",
            "bottleneck", "final loss"]
    rows = []
    for r in rungs:
        ref = [cell(r) for _, cell in refs]
        if not r.ok:
            rows.append([r.stage, r.change, r.status_text(), "", "", *ref, "", "", "", "", "", "", ""])
            continue
        rows.append([
            r.stage, r.change,
            f"{fmt_num(r.m('seconds_mean'))} ± {fmt_num(r.m('seconds_std'), 2)}",
            vs_previous_cell(r, "seconds_mean"), fmt_pct(r.vs(r.baseline, "seconds_mean")),
            *ref,
            f"{r.m('tokens_per_s'):,.0f}",
            fmt_mib(r.m("peak_memory_mib")), r.memory_vs(r.parent),
            mfu_cell(r),
            feed_cell(r),
            bottleneck(r),
            f"{r.m('loss_final'):.3f}",
        ])
    return table(head, rows)


def memory_table(rungs: list[Rung]) -> list[str]:
    n = samples_label(rungs)
    documented = reference_kind(rungs) == "documented"
    head = ["stage", "change", "peak MiB", "vs previous", "vs baseline",
            *(["reference MiB (vs prev.)"] if documented else []), f"s / {n} samples", "time vs prev.",
            *(["reference s"] if documented else []), "tokens/s", "MFU (own dtype / fastest)", "data wait / copy",
            "bottleneck", "final loss"]
    rows = []
    for r in rungs:
        ref_mib = [reference_cell(r, "peak_mib", lambda v: f"{v:,}")] if documented else []
        ref_s = [str(r.reference.get("seconds", ""))] if documented else []
        if not r.ok:
            rows.append([r.stage, r.change, r.status_text(), "", "", *ref_mib, "", "", *ref_s, "", "", "", "", ""])
            continue
        rows.append([
            r.stage, r.change,
            fmt_mib(r.m("peak_memory_mib")),
            vs_previous_cell(r, "peak_memory_mib"), r.memory_vs(r.baseline),
            *ref_mib,
            f"{fmt_num(r.m('seconds_mean'))} ± {fmt_num(r.m('seconds_std'), 2)}",
            fmt_pct(r.vs(r.parent, "seconds_mean")),
            *ref_s,
            f"{r.m('tokens_per_s'):,.0f}",
            mfu_cell(r),
            feed_cell(r),
            bottleneck(r),
            f"{r.m('loss_final'):.3f}",
        ])
    return table(head, rows)


def config_diff(r: Rung) -> set[str]:
    """The TrainConfig fields this stage changed relative to its parent's run."""
    a, b = r.record.get("config", {}), r.parent.get("config", {})
    return {k for k in a if k not in ("extra", "device") and a.get(k) != b.get(k)}


def noise_pct(r: Rung) -> float:
    """Run-to-run noise of the comparison with the parent: the two relative standard deviations combined."""
    cv = [rec["metrics"]["seconds_std"] / rec["metrics"]["seconds_mean"] for rec in (r.record, r.parent)]
    return 100 * math.hypot(*cv)


def within_noise(r: Rung, d: float) -> str:
    """A note when a time change `d` (%) is smaller than the comparison's run-to-run noise."""
    noise = noise_pct(r)
    return f", within run-to-run noise of ±{noise:.0f}%" if abs(d) < noise else ""


def why_no_speedup(r: Rung) -> str:
    """The measured reason a speed stage did not make the ladder faster here."""
    m, p = r.record["metrics"], r.parent["metrics"]
    dev, pdev = r.record["device"], r.parent["device"]
    changed = config_diff(r)
    step = f"steady step {fmt_time(m['step_time_median_s'])} vs {fmt_time(p['step_time_median_s'])} before"
    if "num_workers" in changed:
        waits = f"data wait {p['data_wait_pct']:.0f}% of the time before, {m['data_wait_pct']:.0f}% now"
        why = (f"the previous stage hardly waited for data, so workers had little to win ({waits})"
               if p["data_wait_pct"] < 20 else waits)
        if dev["type"] == "cpu":
            why += f"; on a CPU the {r.record['config']['num_workers']} workers compete with training for " \
                   "the same cores"
        return why
    copy = f"the copy took {fmt_share(p['copy_pct'])} of the time before" if p.get("copy_pct") is not None else ""
    if "pin_memory" in changed and not r.record["choices"]["pinned_memory_non_blocking"]:
        return ("on a CPU there is no host-to-device copy to overlap (choices.pinned_memory_non_blocking is "
                "false), so this change does nothing here and the difference is run-to-run variation"
                + (f" ({copy})" if copy else ""))
    if "pin_memory" in changed and copy:  # CUDA events around the copy: the copy, not the wait before it
        return f"{copy}, so an asynchronous copy had little to hide"
    if "compile" in changed:
        return (f"the compiled steps were not faster at this size ({step}); compilation itself took "
                f"{fmt_time(m['compile_s'])}, outside the timed repeats")
    if "amp" in changed:
        return (f"autocast to {r.record['choices']['amp_dtype']} on {dev['name']} did not pay for its casts "
                f"at this size ({step})")
    if "distributed" in changed and dev["type"] == "cpu":
        return (f"on a CPU the {dev['count']} processes share the cores one process used before "
                f"({dev['threads_per_process']} thread(s) each vs {pdev['threads_per_process']}), so there "
                "is no extra compute to gain, and gradients must still be all-reduced")
    if "batch_size" in changed:
        return f"a bigger batch means fewer steps, but each step got slower in proportion ({step})"
    return step


def why_no_memory_saving(r: Rung) -> str:
    """The measured reason a memory stage did not lower the peak here: what dominates the peak."""
    b, pb = r.record["metrics"].get("memory_breakdown_mib"), r.parent["metrics"].get("memory_breakdown_mib")
    if not b or not pb:
        return "no breakdown recorded"
    parts = {k: b.get(k, 0) for k in BREAKDOWN}
    top = max(parts, key=parts.get)
    share = f"the peak is {parts[top] / b['total']:.0%} {top.replace('_', ' ')} ({fmt_mib(parts[top])} MiB)"
    moved = [k for k in BREAKDOWN if abs(b.get(k, 0) - pb.get(k, 0)) > 0.01 * b["total"]]
    if not moved:
        return (f"what was alive at the peak is unchanged, so the memory this change saves is not held at the "
                f"peak moment ({share})")
    changes = ", ".join(f"{k.replace('_', ' ')} {fmt_mib(pb.get(k, 0))} -> {fmt_mib(b.get(k, 0))} MiB"
                        for k in moved)
    return f"{share}; at the peak: {changes}"


def speed_findings(rungs: list[Rung]) -> list[str]:
    steps = [(r, r.vs(r.parent, "seconds_mean")) for r in rungs]
    steps = [(r, d) for r, d in steps if d is not None]
    lines = []
    if steps:
        best, d = min(steps, key=lambda x: x[1])
        lines.append(f"Largest gain: `{best.stage}` ({best.change}), {fmt_pct(d)} time per "
                     f"{best.m('samples_per_repeat'):,} samples{reference_change(best, 'seconds')}.")
    last = next((r for r in reversed(rungs) if r.vs(r.baseline, "seconds_mean") is not None), None)
    if last:
        ours = last.baseline["metrics"]["seconds_mean"] / last.m("seconds_mean")
        documented = last.baseline_reference.get("seconds") and last.reference.get("seconds")
        theirs = f", {last.baseline_reference['seconds'] / last.reference['seconds']:.1f}x in the reference" \
            if documented else ""
        lines.append(f"Overall, `{last.baseline_stage}` to `{last.stage}`: {ours:.1f}x faster here{theirs}.")
    best_mfu = max((r for r in rungs if r.m("mfu_fastest_pct") is not None), key=lambda r: r.m("mfu_fastest_pct"),
                   default=None)
    if best_mfu:
        lines.append(f"Highest MFU: `{best_mfu.stage}`, {best_mfu.m('mfu_pct'):.1f}% of the peak of the dtype it "
                     f"computes in ({best_mfu.m('peak_flops_source')}), {best_mfu.m('mfu_fastest_pct'):.1f}% of "
                     f"the device's fastest ({best_mfu.m('peak_flops_fastest_source')}).")
    for r, d in steps:
        if d > -NO_GAIN_PCT and not r.record.get("no_effect") and not time_line(r, time_goal=True):
            lines.append(f"`{r.stage}` did not help here ({fmt_pct(d)}{within_noise(r, d)}): {why_no_speedup(r)}.")
    # the stage that switched compilation on (later stages pay it again in their warm-up)
    compiled = next((r for r in rungs if r.ok and r.m("compile_s") is not None
                     and not (ok(r.parent) and r.parent["config"]["compile"])), None)
    if compiled:
        lines.append(compile_line(compiled))
    lines += [f"Warning: `{r.stage}` had torch.compile on, but its profiled step ran no compiled graph: its "
              "timed steps probably ran eager." for r in rungs if ran_eager(r.record)]
    return lines + no_effect_lines(rungs)


def no_effect_lines(rungs: list[Rung]) -> list[str]:
    """Stages whose change does nothing on this device: the reason, instead of a gain read into noise."""
    return [f"`{r.stage}`: {r.record['no_effect']}; its time change is run-to-run variation."
            for r in rungs if r.ok and r.record.get("no_effect")]


def compile_line(r: Rung) -> str:
    """torch.compile's one-time cost, apart from the steady state, and when it pays for itself."""
    cache = {"warm": "graphs loaded from the on-disk compile cache an earlier run filled; a first compile "
                     "on a new machine takes longer",
             "partly warm": "some graphs loaded from the on-disk compile cache an earlier run filled",
             "cold": "compiled from scratch: the compile cache was empty"}.get(r.m("compile_cache"))
    text = (f"Compilation (`{r.stage}`): the first step took {fmt_time(r.m('first_step_s'))}, "
            f"{fmt_time(r.m('compile_s'))} more than a steady step" + (f" ({cache})" if cache else "")
            + "; it is not in the timed repeats.")
    if comparable(r.record, r.parent) and "compile" in config_diff(r):
        saved = r.parent["metrics"]["seconds_mean"] - r.m("seconds_mean")
        if saved > 0:
            text += (f" At {fmt_time(saved)} saved per {r.m('samples_per_repeat'):,} samples it pays for "
                     f"itself after {math.ceil(r.m('compile_s') / saved):,} such repeats.")
        else:
            text += " The steady state was not faster, so here it never pays for itself."
    return text


def memory_findings(rungs: list[Rung]) -> list[str]:
    steps = [(r, r.vs(r.parent, "peak_memory_mib")) for r in rungs]
    steps = [(r, d) for r, d in steps if d is not None]
    lines = []
    if steps:
        best, d = min(steps, key=lambda x: x[1])
        lines.append(f"Largest saving: `{best.stage}` ({best.change}), {fmt_pct(d)} peak memory"
                     f"{reference_change(best, 'peak_mib')}, at {fmt_pct(best.vs(best.parent, 'seconds_mean'))} time.")
    last = next((r for r in reversed(rungs) if r.vs(r.baseline, "peak_memory_mib") is not None), None)
    if last:
        documented = last.ref_vs("peak_mib", last.baseline_reference)
        lines.append(f"Overall, `{last.baseline_stage}` to `{last.stage}`: peak memory "
                     f"{fmt_pct(last.vs(last.baseline, 'peak_memory_mib'))} here"
                     + (f", {fmt_pct(documented)} in the reference" if documented is not None else "")
                     + (" (per process)." if last.record["device"]["count"] > 1 else "."))
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
    return [f"Noisy timing: the repeats of {', '.join(noisy)} differ by more than {NOISY_PCT:.0f}% of their "
            "mean (a busy machine, or repeats too short); rerun those stages before trusting their time "
            "changes."]


def method_notes(rungs: list[Rung], memory_vs_baseline: bool) -> list[str]:
    """How peak memory and MFU were measured, once per distinct method; which memory changes shown (against
    the parent, and the baseline if `memory_vs_baseline`) compare stages measured differently; where the
    allocator snapshots are."""
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
                notes.append(f"† `{r.stage}` measures peak memory as {methods[0]}, `{other['stage']}` as "
                             f"{methods[1]}: their change compares the max_memory_reserved of both.")
            elif basis == "none":
                notes.append(f"`{r.stage}` ({methods[0]}) and `{other['stage']}` ({methods[1]}) measure peak "
                             "memory differently and share no figure, so no memory change is given between them.")
    flops = sorted({r.m("peak_flops_source") for r in done if r.m("peak_flops_per_device")})
    unknown = sorted({r.m("peak_flops_source") for r in done if not r.m("peak_flops_per_device")} - {None})
    notes += [f"MFU is against the device's peak FLOPS, {'; '.join(flops)}."] if flops else []
    notes += [f"No MFU: {u}." for u in unknown]
    snapshots = [f"`{r.m('memory_snapshot')}`" for r in done if r.m("memory_snapshot")]
    if snapshots:
        notes.append(f"The CUDA allocator's record of one training step, beside the records (open at "
                     f"https://pytorch.org/memory_viz): {', '.join(snapshots)}.")
    return notes


# ---------------------------------------------------------------------------------------------------------
# where the time goes: the profiled steps' breakdown (gpt/profiling.py)

# The shares of a step each change attacks (TrainConfig field -> categories). A stage whose change is not
# listed here is described by the category that changed most.
TARGETS = {
    "num_workers": ("data",),
    "pin_memory": ("copy", "data"),  # a blocking copy drains the GPU queue, which then idles while the next batch loads
    "compile": ("gpu_idle", "forward", "backward"),
    "amp": ("forward", "backward"),
    "distributed": ("forward", "backward", "communication"),
    "activation_checkpointing": ("backward",),
    "optimizer_foreach": ("optimizer",),
    "dataset": ("data",),
    "batch_gather": ("data", "copy"),
    "amp_bf16": ("forward", "backward", "optimizer"),  # the scaler's unscale, inf check and host sync
    "tf32": ("forward", "backward"),
    "attention": ("forward", "backward"),
    "vocab_multiple": ("forward", "backward"),
    "optimizer_fused": ("optimizer",),
    "loss": ("forward", "backward"),
    "fsdp_mixed_precision": ("forward", "backward", "communication"),
    "fsdp_cpu_offload": ("optimizer", "copy", "communication"),
}
SMALL_SHARE_PCT = 5.0  # a change whose targets held less than this share of the parent's step had little to win


def shares(record: dict | None) -> dict | None:
    """The record's time breakdown: % of a profiled step's wall time per category, adding up to 100."""
    return record["metrics"].get("time_breakdown_pct") if ok(record) else None


def seconds_by_category(record: dict) -> dict:
    """The timed seconds per N samples, split by the profiled shares."""
    return {c: record["metrics"]["seconds_mean"] * v / 100 for c, v in shares(record).items()}


def fmt_share(x: float | None) -> str:
    return "" if x is None else f"{x:.1f}%" if x < 0.95 else f"{x:.0f}%"


def bottleneck(r: Rung) -> str:
    """The largest share of the stage's step, e.g. "backward 48%"."""
    b = shares(r.record)
    if not b:
        return ""
    top = max(b, key=b.get)
    return f"{label(top)} {fmt_share(b[top])}"


def time_line(r: Rung, time_goal: bool) -> str | None:
    """What the stage's change did to where the time goes, from its breakdown and its parent's: the shares
    the change attacks (TARGETS) or else the one that moved most, as % of the step and seconds per N samples."""
    b, pb = shares(r.record), shares(r.parent)
    if not b or not pb or not comparable(r.record, r.parent) or r.record.get("no_effect"):
        return None  # no breakdown to compare; or nothing changed on this device (no_effect_lines says why)
    t, pt = seconds_by_category(r.record), seconds_by_category(r.parent)
    cats = [c for c in CATEGORIES if c in b or c in pb]
    targets = list(dict.fromkeys(c for f in sorted(config_diff(r)) for c in TARGETS.get(f, ()) if c in cats))
    biggest = max(cats, key=lambda c: abs(t.get(c, 0) - pt.get(c, 0)))
    d = r.vs(r.parent, "seconds_mean")
    head = f"`{r.stage}` ({fmt_pct(d)} time{within_noise(r, d)}"
    if time_goal and d > -NO_GAIN_PCT:
        if targets and all(pb.get(c, 0) < SMALL_SHARE_PCT for c in targets):
            was = " and ".join(f"{label(c)} was {fmt_share(pb.get(c, 0))}" for c in targets)
            return f"{head}, did not help): {was} of the step already, so there was little to remove"
        head += ", did not help"

    def moved(c: str) -> str:
        return (f"{label(c)} {fmt_share(pb.get(c, 0))} -> {fmt_share(b.get(c, 0))} "
                f"({fmt_time(pt.get(c, 0))} -> {fmt_time(t.get(c, 0))})")

    cited = targets or [biggest]
    return f"{head}): " + ", ".join(map(moved, cited)) + (
        f"; largest change: {moved(biggest)}" if biggest not in cited else "")


def time_lines(rungs: list[Rung], time_goal: bool) -> list[str]:
    """Under a ladder's table: one line per stage from the breakdowns of the stage and of its parent."""
    lines = [time_line(r, time_goal) for r in rungs]
    lines = [ln for ln in lines if ln]
    if not lines:
        return []
    return ["", f"Where the time goes, stage by stage (share of a profiled step's wall time, then seconds per "
                f"{samples_label(rungs)} samples; the bottleneck column is the largest share):", ""] + \
        [f"- {ln}" for ln in lines]


def time_section(runs: Path, ladders: dict[str, list[Rung]], plots: Path, rel: str) -> list[str]:
    """The breakdown plot of every ladder, how the shares are measured, and where the traces are."""
    if not plot_time_breakdown(ladders, plots / "time_breakdown.png"):
        return []
    profiled = [r for rungs in ladders.values() for r in rungs if shares(r.record)]
    traces = [r.stage for r in profiled if r.m("profiler").get("trace")]
    steps = sorted({r.m("profiler")["steps"] for r in profiled})
    gpu = any("gpu_idle" in shares(r.record) for r in profiled)
    lines = ["", "## Where the time goes", "",
             f"After its timed repeats, each stage trains {' or '.join(map(str, steps))} more step(s) under "
             "`torch.profiler` (rank 0 of distributed stages). Every instant of those steps goes to one "
             "category, so the shares add up to 100%; the bars split each stage's timed seconds by them. "
             + ("On the GPU a category is what the GPU was doing (the phase that launched the running kernel); "
                "GPU idle is time with no kernel running while the host was neither waiting for data nor "
                "copying. " if gpu else "On the CPU a category is the phase the training thread was in. ")
             + "README.md, 'Where the time goes', defines each one.", "",
             f"![where the time goes]({rel}/time_breakdown.png)"]
    if traces:
        lines += ["", f"Traces: `{display(runs)}/<stage>.trace.json.gz` for {len(traces)} stage(s); open one in "
                      "https://ui.perfetto.dev or chrome://tracing."]
    return lines


# ---------------------------------------------------------------------------------------------------------
# plots (matplotlib, Agg: no display needed)


def short(stage: str) -> str:
    """'speed_3_non_blocking' -> '3 non blocking' for axis labels."""
    _, i, name = stage.split("_", 2)
    return f"{i} {name.replace('_', ' ')}"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax, rungs: list[Rung], values: list[float | None], fmt, errors=None, color="tab:blue"):
    """One bar per stage; a stage without a value shows its status instead of a bar."""
    x = range(len(rungs))
    heights = [v or 0 for v in values]
    ax.bar(x, heights, yerr=errors, color=color, capsize=3)
    tops = [h + e for h, e in zip(heights, errors or [0] * len(heights))]  # label above the error bar
    top = max(tops) or 1
    for i, (r, v) in enumerate(zip(rungs, values)):
        text = fmt(v) if v is not None else (r.record or {}).get("status", "not run")
        ax.text(i, tops[i] + top * 0.02, text, ha="center", va="bottom", fontsize=8,
                color="black" if v is not None else "tab:red")
    ax.set_xticks(list(x), [short(r.stage) for r in rungs], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, top * 1.18)


def _relative(ax, rungs: list[Rung], key: str, ref_key: str, what: str):
    """This run and the reference, each relative to its own baseline (different hardware, same shape)."""
    x = list(range(len(rungs)))
    # a ladder beyond the book is drawn relative to its lineage's baseline (speed_0, memory_0)
    base = rungs[0].baseline if rungs[0].baseline_stage else rungs[0].record
    changes = [r.vs(base, key) for r in rungs]  # peak memory only as measured alike
    ours = [None if d is None else 1 + d / 100 for d in changes]
    documented = [r.reference.get(ref_key) for r in rungs]
    theirs = [v / documented[0] for v in documented] if None not in documented else []
    if theirs:
        ax.plot(x, theirs, "s--", color="tab:gray", label="reference (H100)")
    ax.plot([i for i, v in zip(x, ours) if v is not None], [v for v in ours if v is not None], "o-",
            color="tab:orange", label="this run")
    ax.set_xticks(x, [short(r.stage) for r in rungs], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, max([1.05] + [v * 1.1 for v in ours + theirs if v is not None]))
    ax.set_title(f"{what} relative to {lineage(rungs[0].stage)[0]}")
    ax.axhline(1, color="black", lw=0.5)
    ax.legend(fontsize=8)


def plot_speed(rungs: list[Rung], path: Path, title: str = "Speed ladder") -> None:
    plt = _pyplot()
    n = samples_label(rungs)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    _bars(axes[0], rungs, [r.m("seconds_mean") for r in rungs], fmt_num,
          errors=[r.m("seconds_std") or 0 for r in rungs])
    axes[0].set_title(f"seconds per {n} samples (mean ± std)")
    _bars(axes[1], rungs, [r.m("tokens_per_s") for r in rungs], lambda v: f"{v:,.0f}", color="tab:green")
    axes[1].set_title("tokens / s")
    _relative(axes[2], rungs, "seconds_mean", "seconds", "time")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stacked(ax, labels: list[str], breakdowns: list[dict | None], title: str):
    """Stacked bars of a memory breakdown (MiB), one per stage; 'other' holds buffers and the rest."""
    plt = _pyplot()
    bottoms = [0.0] * len(labels)
    colors = plt.get_cmap("tab10").colors
    for j, part in enumerate(BREAKDOWN + ["other"]):
        values = []
        for b in breakdowns:
            if not b:
                values.append(0.0)
            elif part == "other":
                values.append(max(0.0, b.get("total", 0) - sum(b.get(k, 0) for k in BREAKDOWN)))
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
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    _bars(axes[0], rungs, [r.m("peak_memory_mib") for r in rungs], fmt_mib, color="tab:purple")
    axes[0].set_title("peak memory, MiB (per process)")
    _stacked(axes[1], [short(r.stage) for r in rungs], [r.m("memory_breakdown_mib") for r in rungs],
             "at the peak: what the memory holds (MiB)")
    _relative(axes[2], rungs, "peak_memory_mib", "peak_mib", "peak memory")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_time_breakdown(ladders: dict[str, list[Rung]], path: Path) -> bool:
    """Stacked horizontal bars, one per stage and a panel per ladder: the timed seconds per N samples split
    by the profiled time breakdown. False (no plot) when no stage has a breakdown."""
    shown = {name: rungs for name, rungs in ladders.items() if any(shares(r.record) for r in rungs)}
    if not shown:
        return False
    plt = _pyplot()
    sizes = [len(rungs) for rungs in shown.values()]
    fig, axes = plt.subplots(len(shown), 1, figsize=(11, 1.0 + 0.4 * sum(sizes) + 0.9 * len(shown)),
                             gridspec_kw={"height_ratios": sizes}, squeeze=False)
    colors = dict(zip(CATEGORIES, plt.get_cmap("tab10").colors))
    for ax, (name, rungs) in zip(axes[:, 0], shown.items()):
        parts = [seconds_by_category(r.record) if shares(r.record) else {} for r in rungs]
        left = [0.0] * len(rungs)
        for c in CATEGORIES:
            widths = [p.get(c, 0.0) for p in parts]
            if any(widths):
                ax.barh(range(len(rungs)), widths, left=left, color=colors[c], label=label(c))
                left = [a + w for a, w in zip(left, widths)]
        for i, (r, p) in enumerate(zip(rungs, parts)):
            if not p:
                status = (r.record or {}).get("status", "not run")
                ax.text(0, i, f" {status if status != 'ok' else 'no breakdown recorded'}", va="center",
                        fontsize=8, color="tab:red")
        ax.set_yticks(range(len(rungs)), [short(r.stage) for r in rungs], fontsize=8)
        ax.invert_yaxis()  # the baseline on top, as in the tables
        ax.set_xlabel(f"seconds per {samples_label(rungs)} samples")
        ax.set_title(f"{name.capitalize()} ladder: where the time goes", fontsize=10)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_timelines(rungs: list[Rung], path: Path) -> bool:
    """Live tensor memory through one instrumented training step, one curve per memory stage."""
    curves = [(r, r.m("memory_timeline_mib")) for r in rungs]
    curves = [(r, c) for r, c in curves if c]
    if not curves:
        return False
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.8))
    for r, c in curves:
        x = [100 * i / max(1, len(c) - 1) for i in range(len(c))]
        ax.plot(x, c, label=f"{short(r.stage)} (peak {fmt_mib(max(c))} MiB)")
    ax.set_xlabel("progress through one training step (%, allocation events)")
    ax.set_ylabel("live tensor memory, MiB")
    ax.set_title("Memory over one training step (rank 0 for distributed stages)")
    ax.set_ylim(0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# ---------------------------------------------------------------------------------------------------------
# the memory planner's outputs (gpt/memory.py), when present


def planner_section(runs: Path, plots: Path, rel: str) -> list[str]:
    files = {k: read_record(runs / f"memory_{k}.json") for k in ("reference", "fit", "compare")}
    if not any(files.values()):
        return []
    lines = ["## Memory planner", "",
             "Estimates of `python -m gpt.memory` (FakeTensorMode: shapes only, no real memory used)."]
    ref = files["reference"]
    if ref:
        lines += ["", f"### Estimate vs the reference's H100 figures ({ref.get('target', '?')})", "",
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
        lines += [""] + [f"- {note}" for note in ref.get("notes", [])]
        stages = [s for s in ref.get("stages", []) if s.get("breakdown_mib")]
        if stages:
            plt = _pyplot()
            fig, ax = plt.subplots(figsize=(9, 4.8))
            breakdowns = [{**s["breakdown_mib"], "total": s["estimate_mib"]} for s in stages]
            _stacked(ax, [short(s["stage"]) for s in stages], breakdowns, "estimated peak breakdown (MiB)")
            for key, style, legend in (("documented_mib", "k_", "documented"), ("snapshot_mib", "r_", "traced step")):
                marks = [(i, s[key]) for i, s in enumerate(stages) if s.get(key)]
                if marks:
                    ax.plot(*zip(*marks), style, markersize=30, mew=2, label=legend)
            ax.legend(fontsize=8)
            fig.tight_layout()
            fig.savefig(plots / "memory_planner.png", dpi=110)
            plt.close(fig)
            lines += ["", f"![estimated breakdown]({rel}/memory_planner.png)"]
    fit = files["fit"]
    if fit:
        lines += ["", f"### Largest model that fits in {fit.get('budget_gib', '?')} GiB", ""]
        if fit.get("shape_rule"):
            lines += [f"Shapes: {fit['shape_rule']}", ""]
        lines += table(["setting", "processes", "layers", "parameters", "peak MiB (GPU)", "documented parameters",
                        "host memory per GPU"], [
            [row["setting"] + (" *" if row.get("extrapolated") else ""), str(row["world_size"]), str(row["n_layer"]),
             f"{row['params'] / 1e6:,.0f}M", fmt_mib(row["peak_mib"]),
             f"{row['documented_params'] / 1e6:,.0f}M" if row.get("documented_params") else "",
             f"{row['host_mib'] / 1024:,.0f} GiB" if row.get("host_mib") is not None else ""]
            for row in fit.get("rows", [])])
        lines += [""] + [f"- {note}" for note in fit.get("notes", [])]
    compare = files["compare"]
    if compare:
        lines += ["", f"### Estimate vs measured ({compare.get('profile', '?')} profile)", ""]
        lines += table(["stage", "measured MiB", "estimate MiB", "error"], [
            [s["stage"], fmt_mib(s["measured_mib"]), fmt_mib(s["estimate_mib"]),
             "" if s.get("error_pct") is None else f"{s['error_pct']:+.1f}%"]
            for s in compare.get("stages", [])])
        unestimated = [f"- `{s['stage']}`: {note}" for s in compare.get("stages", [])
                       if s.get("estimate_mib") is None for note in s.get("notes", [])]
        lines += [""] + unestimated if unestimated else []
        if any(s.get("target") == "cuda" for s in compare.get("stages", [])):
            lines += ["", "On CUDA, measured is max_memory_allocated, what the planner predicts (for a stage with "
                      "CUDA graphs the ladder's peak is the reservation)."]
    return lines


# ---------------------------------------------------------------------------------------------------------


def display(path: Path) -> str:
    """A path relative to the repo when inside it (reports are read on other machines)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def ladder_intro(name: str, rungs: list[Rung]) -> str:
    """What the ladder's comparisons mean."""
    start = STARTS_FROM.get(name)
    text = ("Each stage keeps every earlier change" + (f", on top of `{start}` and the stages before it" if start
                                                         else "")
            + f"; 'vs previous' compares with the stage above{f' (for the first: `{start}`)' if start else ''}, "
            f"'vs baseline' with `{lineage(rungs[0].stage)[0]}`. ")
    kind = reference_kind(rungs)
    if kind == "documented":
        return text + "The reference is the documented H100 run (other hardware: compare the changes, not the seconds)."
    if kind == "anchor":
        return text + (f"Beyond the book: the anchor figures come from {ANCHOR_SETUP}; compare the changes, not "
                       "the figures (other model, hardware and batch). MFU is given against the peak of the "
                       "dtype a stage computes in and against the device's fastest peak.")
    return text + "Beyond the book: no documented figures to compare with."


def write_report(runs: Path, out: Path | None = None) -> Path:
    """Regenerate results.md (default: inside `runs`) and its plots/ from the records in `runs`."""
    runs = Path(runs)
    out = Path(out) if out else runs / "results.md"
    records = load_records(runs)
    if not records:
        raise UserError(f"no stage records in {runs} (run ./run_all.sh or a stage script first)")
    plots = out.parent / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    rel = "plots"
    lines = header(runs, records)
    ladders = ladders_of(records)
    for name, rungs in ladders.items():
        done, time_goal = sum(r.ok for r in rungs), LADDER_GOAL[name] == "time"
        title = f"{name.capitalize()} ladder"
        lines += ["", f"## {title}", "", f"{done} of {len(rungs)} stages finished. " + ladder_intro(name, rungs), ""]
        lines += speed_table(rungs) if time_goal else memory_table(rungs)
        findings = speed_findings(rungs) if time_goal else memory_findings(rungs)
        lines += [""] + [f"- {f}" for f in findings + noise_line(rungs) + method_notes(rungs, not time_goal)]
        lines += time_lines(rungs, time_goal)
        if done:
            if time_goal:
                plot_speed(rungs, plots / f"{name}.png", title)
                lines += ["", f"![{name} ladder]({rel}/{name}.png)"]
            else:
                plot_memory(rungs, plots / f"{name}.png", title)
                lines += ["", f"![{name} ladder]({rel}/{name}.png)"]
                if plot_timelines(rungs, plots / f"{name}_timeline.png"):
                    lines += ["", f"![memory over one step]({rel}/{name}_timeline.png)"]
    lines += time_section(runs, ladders, plots, rel)
    planner = planner_section(runs, plots, rel)
    if planner:
        lines += [""] + planner
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)
    return out


def default_runs_dir() -> Path:
    from gpt.ladder import device_type
    from gpt.profiles import default_profile

    dev = device_type("auto")
    return REPO_ROOT / "runs" / f"{default_profile(dev)}-{dev}"


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Regenerate results.md and its plots from a ladder's JSON records.")
    p.add_argument("--runs", type=Path, help="records directory (default: runs/<default profile>-<device>)")
    p.add_argument("--out", type=Path, help="the Markdown file to write (default: <runs>/results.md); "
                   "plots go to plots/ beside it")
    args = p.parse_args(argv)
    runs = args.runs or default_runs_dir()
    if not runs.is_dir():
        raise UserError(f"records directory {runs} does not exist")
    print(f"wrote {write_report(runs, args.out)}")


if __name__ == "__main__":
    main()

"""The README's generated blocks: figures written from the committed records, never typed.

A block sits between two markers in README.md, `<!-- generated: NAME -->` and `<!-- end: NAME -->` (inline or over
several lines). The README quotes the committed run on 2 CPU cores (README_RECORDS): `python -m gpt.report` with no
arguments, and a whole default `./run_all.sh` on a CPU, rewrite each block from those records as they rewrite
results.md, and tests/test_report.py holds the committed README to what they write.
"""

import contextlib
import io
import re
import statistics
from datetime import datetime
from pathlib import Path

import torch

from gpt import first_run, quick_run, suite_time
from gpt.committed_records import PUBLISHED, published_dir
from gpt.data import REPO_ROOT
from gpt.devices import same_cpu_kind
from gpt.files import write_atomically
from gpt.flops import peak_label
from gpt.formatting import table
from gpt.ladder import declaration, stage_config, stages_of, timed_ladders
from gpt.optimizations.compilation import COMPILE_COSTS
from gpt.record_reuse import was_reused
from gpt.records import read_record, time_to_loss_dir
from gpt.report.memory_planner import MACHINE_INDEPENDENT, report_file
from gpt.report.rows import MACHINE_FILE, ok
from gpt.report.speedrun import (
    BASELINE,
    LADDER,
    NOISE_SCALE_FILE,
    Speedrun,
    speedrun_findings,
    speedrun_table,
    speedup_range,
)
from gpt.report.time_to_loss import LossRuns
from gpt.stage import print_loss_summary

README = REPO_ROOT / "README.md"
README_RECORDS = published_dir("cpu", "cpu")  # the run the README's figures come from
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- end: (?P=name) -->)", re.S)


def faster_step_headline(runs: LossRuns) -> str:
    """The first finding: the first model-changing stage's gain in tokens a second, and the steps it gives up.

    The gain against each of the baseline's seeds, as a range: the stage ran one seed, and a rate's gain smaller than
    the seeds' spread would otherwise read as a finding."""
    kept = next(iter(runs.kept_models()), None)
    if kept is None or not ok(runs.records.get(BASELINE)):
        return "no stage of the committed run changes the model"
    base, mine = runs.records[BASELINE]["metrics"], runs.records[kept]["metrics"]
    rates = runs.baseline_rates
    gains = sorted(100 * (mine["tokens_per_s"] / rate - 1) for rate in rates)
    return (
        f"`{kept}` trains {rate_change(gains[0], gains[-1])} tokens a second than `{BASELINE}` (its one seed against "
        f"the baseline's {len(rates)}) but takes {base['steps'] / mine['steps']:.0f}x fewer optimizer steps, and ends "
        f"at {runs.final(kept):.3f} against {runs.final(BASELINE):.3f}"
    )


def rate_change(low_pct: float, high_pct: float) -> str:
    """A rate's change in per cent from its lowest to its highest comparison: "18-32% more", "5% fewer", ..."""
    low, high = round(low_pct), round(high_pct)
    if low < 0 < high:
        return f"from {-low}% fewer to {high}% more"
    a, b = (low, high) if low >= 0 else (-high, -low)
    return (f"{a}%" if a == b else f"{a}-{b}%") + (" more" if low >= 0 else " fewer")


def speedrun_headline(sr: Speedrun) -> str:
    """The second finding: the last stage's speedup to the baseline's model, in training seconds and whole process."""
    held = [s for s in sr.stages if sr.holds(s)]
    base = sr.seconds(BASELINE)
    if not held or not base or None in base:
        return "no speedrun stage has reached the baseline's model in the committed run"
    last = held[-1]
    seconds, (walls, clock), (base_walls, base_clock) = sr.seconds(last), sr.walls(last), sr.walls(BASELINE)
    text = (
        f"`{last}` reaches it {speedup_range(base, seconds)} sooner in training seconds ({len(seconds)} seeds "
        f"against {len(base)})"
    )
    if walls and clock == base_clock:
        text += f", {speedup_range(base_walls, walls)} in the whole process"
    return text


def planner_headline(runs: Path) -> str:
    """The third finding's figures: the planner against the book's traced H100 steps, and its baseline explained.

    From the planner's reference record in `runs` and this project's own measurement of memory_0 on a GPU, the
    newest committed GPU folder that has one."""
    reference = read_record(runs / report_file("reference"))
    gpu = newest_gpu_record("memory_0_baseline.json")
    if not reference or not gpu:
        return "the planner's comparison with the book's traced steps is not in the committed records"
    errors = [abs(s["snapshot_error_pct"]) for s in reference["stages"] if s.get("snapshot_error_pct") is not None]
    baseline = reference["stages"][0]
    documented = baseline["documented_mib"]
    gelu_gib = (baseline["newgelu_estimate_mib"] - baseline["project_estimate_mib"]) / 1024  # the book's GELU's extra
    return (
        f"estimates the book's traced H100 steps within {max(errors):.1f}% and explains their baseline's "
        f"{documented / 1024:.1f} GiB, {gpu[1]['metrics']['peak_memory_mib'] / 1024:.1f} GiB with this project's "
        f"model (on an {gpu[1]['device']['name'].removeprefix('NVIDIA ')}): the book's hand-written GELU keeps "
        f"{gelu_gib:.1f} GiB more for backward, and its gradients outlive the step"
    )


def run_minutes(runs: Path) -> str:
    """How long the committed CPU run took, in minutes (the machine table's time cell).

    machine.json's `wall_s` where run_all wrote it (the command's whole wall clock, data and planner included); a run
    older than that field gives the span from machine.json's start to its newest stage record, and says so (a record
    counted later, such as the n-gram floor's, is not the run's)."""
    machine = read_record(runs / MACHINE_FILE) or {}
    if machine.get("wall_s"):
        return f"{machine['wall_s'] / 60:.0f} min"
    span = max(_stage_record_ends(runs, "**/*_*.json")) - datetime.fromisoformat(machine["started"])
    return f"{span.total_seconds() / 60:.0f} min from its start to its last record"


def _stage_record_ends(runs: Path, pattern: str) -> list[datetime]:
    """When each stage record in `runs` matching `pattern` was written (its env.time)."""
    records = map(read_record, runs.glob(pattern))
    return [datetime.fromisoformat(r["env"]["time"]) for r in records if r and "stage" in r and "env" in r]


def run_split(runs: Path) -> str:
    """Where the committed CPU run's time went, part by part, from when each part's last record was written.

    The four ladders' records sit at the top of the folder, the runs to a loss in time_to_loss/ and speedrun/, in the
    order run_all runs them; each part's time runs from the end of the one before (machine.json's start for the
    first) to its own last record. The planner and the report come after the last record: machine.json's `wall_s`
    gives them, where run_all wrote it."""
    machine = read_record(runs / MACHINE_FILE) or {}
    parts = [
        ("the four ladders", "*_*.json"),
        ("the time to loss", "time_to_loss/*.json"),
        ("the speedrun", "speedrun/*.json"),
    ]
    start = before = datetime.fromisoformat(machine["started"])
    spans = []
    for name, pattern in parts:
        if ends := _stage_record_ends(runs, pattern):
            spans.append(f"{name} {(max(ends) - before).total_seconds() / 60:.1f} min")
            before = max(ends)
    if machine.get("wall_s"):
        spans.append(
            f"the planner and the report {(machine['wall_s'] - (before - start).total_seconds()) / 60:.1f} min"
        )
    reuse = measured_or_reused(runs)
    return (
        f"{run_minutes(runs)} ({start:%Y-%m-%d}, commit {machine.get('git_commit', 'unknown')[:7]}): {', '.join(spans)}"
        + (f"; that run {reuse}" if reuse else "")
    )


def reusable_records(runs: Path) -> dict[str, list[Path]]:
    """The machine-independent records a full run reuses from records/ where their code is unchanged, by name.

    Those gpt/run_all.py passes to their processes' --reuse (gpt/record_reuse.py)."""
    return {
        "the noise-scale curve": [time_to_loss_dir(runs, LADDER) / NOISE_SCALE_FILE],
        "the planner's H100 estimates": [runs / report_file(r) for r in MACHINE_INDEPENDENT],
    }


def measured_or_reused(runs: Path) -> str:
    """Which of the reusable records a run computed, and which it took from records/.

    By the mark `record_reuse.reuse_record` leaves on a record it reuses (`reused_from`): a part is reused where any
    of its records carries it. Empty where none is there."""
    measured, reused = [], []
    for name, files in reusable_records(runs).items():
        records = [r for r in map(read_record, files) if r and r.get("provenance")]
        if records:
            (reused if any(map(was_reused, records)) else measured).append(name)
    said = []
    if measured:
        said.append(f"measured {' and '.join(measured)} afresh")
    if reused:
        said.append(f"reused {' and '.join(reused)} from `records/` (their code unchanged)")
    return " and ".join(said)


def run_time(runs: Path) -> str:
    """run_minutes, with the machine the run was on and its commit (the footnote under the README's commands)."""
    machine = read_record(runs / MACHINE_FILE) or {}
    peaks, cores = machine.get("cpu_peaks_gflops", {}), machine.get("cpu_count")
    fp32, bf16 = (peaks.get(peak_label(dtype, cores)) for dtype in (torch.float32, torch.bfloat16))
    bf16_text = ""
    if fp32 and bf16:  # a CPU without bf16 units emulates it, a hundred times slower
        ratio = f"{bf16 / fp32:.1f}x as fast as" if bf16 >= fp32 else f"{fp32 / bf16:.0f}x slower than"
        bf16_text = f", whose bf16 matmuls ran {ratio} its fp32 ones"
    device = next((r["device"]["name"] for r in map(read_record, sorted(runs.glob("*_*.json"))) if ok(r)), "a CPU")
    commit = machine.get("git_commit", "unknown")[:7]
    return f"{run_minutes(runs)}, on a {cores}-core {device}{bf16_text}, at commit {commit}"


def gpu_folders() -> list[Path]:
    """The committed folders of GPU runs (their machine.json says cuda), the newest run first."""
    machines = {f: read_record(f / MACHINE_FILE) or {} for f in PUBLISHED.iterdir() if f.is_dir()}
    gpu = [f for f, m in machines.items() if m.get("device") == "cuda"]
    return sorted(gpu, key=lambda f: machines[f].get("started", ""), reverse=True)


def newest_gpu_record(name: str) -> tuple[Path, dict] | None:
    """The newest committed GPU run's finished record `name` (a path in its folder), with that folder; else None.

    Record by record, since a run need not hold every ladder (a quick run's folder has no memory ladder)."""
    return next(((f, r) for f in gpu_folders() if ok(r := read_record(f / name))), None)


def source_cell(folder: Path, record: dict) -> str:
    """Where a GPU figure comes from: its folder (linked to its page), the commit and the torch that made it."""
    commit, torch_version = record["env"]["git_commit"][:7], record["env"]["torch"]
    return f"[records/{folder.name}](records/{folder.name}/results.md), commit {commit}, torch {torch_version}"


def ladder_gpu_run(ladder: str) -> tuple[Path, dict[str, dict | None], list[str]] | None:
    """The committed GPU run that finished most of a ladder: its folder, its stage records, the stages it finished.

    Of runs that finished as many of its stages, the newest; None where no GPU run finished any."""
    stages = stages_of(ladder)
    records = {f: {s: read_record(f / f"{s}.json") for s in stages} for f in gpu_folders()}
    finished = {f: [s for s in stages if ok(records[f][s])] for f in records}
    if not any(finished.values()):
        return None
    folder = max(finished, key=lambda f: len(finished[f]))  # max keeps the first, the newest, of equals
    return folder, records[folder], finished[folder]


def gpu_memory_table() -> str:
    """Each ladder's peak GPU memory per process, stage by stage, from the committed GPU run that finished most of it.

    One run a ladder (ladder_gpu_run), so that a row compares like with like."""
    rows = []
    for ladder in timed_ladders():
        stages = stages_of(ladder)
        two = ", ".join(f"`{s}`" for s in stages if stage_config(s, "reference").world_size > 1) or "none"
        if (run := ladder_gpu_run(ladder)) is None:
            rows.append([ladder, "no committed GPU run has it", "", two])
            continue
        folder, records, finished = run
        cells = []
        for stage in stages:
            record = records[stage]
            if record is None:
                cells.append(f"`{stage}` not run")
            elif ok(record):
                cells.append(f"`{stage}` {record['metrics']['peak_memory_mib'] / 1024:.1f}")
            else:
                cells.append(f"`{stage}` {record['status']}")
        rows.append([ladder, ", ".join(cells), source_cell(folder, records[finished[0]]), two])
    return "\n".join(["", *table(["ladder", "GiB per process", "from", "needs 2 GPUs"], rows), "", ""])


def gpu_memory_peaks() -> str:
    """Each ladder's largest peak GPU memory per process over the stages it finished (the GPU paragraph's summary)."""
    parts = []
    for ladder in timed_ladders():
        if run := ladder_gpu_run(ladder):
            _, records, finished = run
            peak = max(records[s]["metrics"]["peak_memory_mib"] for s in finished) / 1024
            parts.append(f"{ladder} up to {peak:.1f} GiB")
    return ", ".join(parts) or "no committed GPU run"


def gpu_speedrun_line() -> str:
    """The speedrun on the newest committed GPU run that trained it: seconds and wall clocks of speed_0 and the last."""
    for folder in gpu_folders():
        sr = Speedrun(folder)
        held = [s for s in sr.stages if sr.holds(s)]
        if not held or not sr.holds(BASELINE):
            continue
        last, fewest = held[-1], min(held, key=sr.mean_seconds)
        base, mine, (base_walls, _) = sr.mean_seconds(BASELINE), sr.mean_seconds(last), sr.walls(BASELINE)
        (walls, _), record = sr.walls(last), sr.stages[last][0]

        def wall(values: list[float]) -> str:
            return f"{statistics.fmean(values):.1f} s" if values else "no wall clock"

        text = (
            f"on one {record['device']['name'].removeprefix('NVIDIA ')} ({source_cell(folder, record)}, "
            f"{len(sr.stages[last])} seed a stage), `{BASELINE}` reaches the target {sr.target:.3f} in "
            f"{base:.1f} s of training ({wall(base_walls)} of wall clock) and `{last}` in {mine:.2f} s "
            f"({base / mine:.1f}x sooner; {wall(walls)} of wall clock"
        )
        if base_walls and walls:
            text += f", {statistics.fmean(base_walls) / statistics.fmean(walls):.1f}x"
        text += ")"
        if fewest != last:
            text += f"; the fewest training seconds are `{fewest}`'s, {sr.mean_seconds(fewest):.2f} s"
        # said, so that the last stage trained there is not taken for the speedrun's last
        if untrained := sr.after(last):
            names = ", ".join(f"`{s}`" for s in untrained)
            text += f"; {len(untrained)} later stage{'s' * (len(untrained) > 1)} did not finish there ({names})"
        return text
    return "no committed GPU run has trained the speedrun"


def gpu_quick_runs_of() -> list[tuple[Path, dict, list[dict]]]:
    """The committed GPU folders a quick run made, newest first: each folder, one finished stage record, its runs.

    A finished record, since only one that trained names its device: a quick run's folder also holds the records of
    the stages it had no room for."""
    found = []
    for folder in gpu_folders():
        runs = (read_record(folder / quick_run.RUN_FILE) or {}).get("runs")
        record = next((r for p in sorted(folder.rglob("*.json")) if ok(r := read_record(p))), None)
        if runs and record:
            found.append((folder, record, runs))
    return found


def newest_gpu_quick_run() -> tuple[Path, dict, list[dict]] | None:
    """The newest committed GPU folder a quick run made (gpu_quick_runs_of), else None."""
    return next(iter(gpu_quick_runs_of()), None)


def gpu_quick_line() -> str:
    """The one-GPU quick run's row: its newest committed run's plan and wall clock, from quick_run.json."""
    if (found := newest_gpu_quick_run()) is None:
        return "no committed GPU run has made one"
    folder, record, runs = found
    first = runs[0]
    reflowed = sum(bool(item.get("reflowed")) for item in first["items"])
    gpu = record["device"]["name"].removeprefix("NVIDIA ")
    return (
        f"its newest, on one {gpu} ([note](records/{folder.name}/note.md), "
        f"commit {record['env']['git_commit'][:7]}), planned {quick_run.minutes(first['planned_s'])} and took "
        f"{quick_run.minutes(first['wall_s'])}, {reflowed} stage run{'s' * (reflowed != 1)} more than planned in the "
        "time left"
    )


def gpu_quick_runs(runs: list[dict]) -> str:
    """A GPU quick run's commands (quick_run.json's runs): the first's wall clock and what ran, then each --resume's."""

    def ran(run: dict) -> str:
        not_stages = (quick_run.GPU_TESTS, quick_run.PLANNER)
        names = [item["name"] for item in run["items"] if item.get("ran") and item["section"] not in not_stages]
        sections = ", ".join(dict.fromkeys(item["section"] for item in run["items"] if item.get("ran")))
        return f"{quick_run.minutes(run['wall_s'])} ({len(names)} stage runs: {sections})"

    text = f"`--quick`: {ran(runs[0])} of its {quick_run.minutes(runs[0]['limit_s'])}"
    if runs[1:]:
        text += "; then `--quick --only <section> --resume`: " + ", ".join(ran(run) for run in runs[1:])
    return text


def gpu_batch_line() -> str:
    """The speed ladder's biggest change on GPUs: batch x8's change per sample, the book's and each GPU run's.

    With the whole ladder's speedup (speed_0 over its last one-GPU stage) where a run finished that stage."""
    first, batch, last = stages_of("speed")[0], stages_of("speed")[1], stages_of("speed")[-2]
    book = declaration(first).reference["seconds"], declaration(batch).reference["seconds"]
    parts = [f"on the book's H100 batch x8 (`{batch}`) is {100 * (book[1] / book[0] - 1):+.0f}% per sample"]
    for folder in gpu_folders():
        base, mine = (read_record(folder / f"{s}.json") for s in (first, batch))
        if not (ok(base) and ok(mine)):
            continue
        text = (
            f"{100 * (mine['metrics']['seconds_mean'] / base['metrics']['seconds_mean'] - 1):+.0f}% on "
            f"[{folder.name}](records/{folder.name}/results.md)"
        )
        if ok(end := read_record(folder / f"{last}.json")):
            ladder = base["metrics"]["seconds_mean"] / end["metrics"]["seconds_mean"]
            text += f" ({ladder:.1f}x from `{first}` to `{last}`)"
        parts.append(text)
    return "; ".join(parts)


def model_cell(record: dict | None) -> str:
    """A model in a few words from a record: layers, width, vocabulary, parameters."""
    if not ok(record):
        return "not in the committed records"
    m = record["model"]
    return (
        f"{m['n_layer']} layers of {m['n_embd']}, vocabulary {m['vocab_size']:,}: "
        f"{m['params'] / 1e6:.{1 if m['params'] >= 1e6 else 2}f}M parameters"
    )


def models_table(runs: Path) -> str:
    """Which model each part of the project trains on 2 CPU cores and on a GPU, from the committed records."""

    def on_gpu(found: tuple | None) -> str:  # newest_gpu_record's answer
        return model_cell(found[1]) if found else "no GPU run committed"

    task = model_cell(read_record(time_to_loss_dir(runs) / f"{BASELINE}.json"))
    cpu_speed, gpu_speed = read_record(runs / f"{BASELINE}.json"), newest_gpu_record(f"{BASELINE}.json")
    rows = [
        ["speed and fast ladders", model_cell(cpu_speed), on_gpu(gpu_speed)],
        [
            "memory and lean ladders",
            model_cell(read_record(runs / "memory_0_baseline.json")),
            on_gpu(newest_gpu_record("memory_0_baseline.json")),
        ],
        ["time to loss, speedrun", task, "the speedrun: the same; the time to loss: the speed ladder's"],
    ]
    why = larger_speed_model(cpu_speed, gpu_speed[1] if gpu_speed else None)
    header = ["trains", "on 2 CPU cores (`cpu` profile)", "on one GPU (`reference` profile)"]
    return "\n".join(["", *table(header, rows), "", why, ""])


def larger_speed_model(cpu: dict | None, gpu: dict | None) -> str:
    """Why the CPU's speed model has more parameters than the GPU's: its vocabulary's token embedding, in figures."""
    if not (ok(cpu) and ok(gpu)) or cpu["model"]["vocab_size"] <= gpu["model"]["vocab_size"]:
        return ""
    m = cpu["model"]
    embedding = m["vocab_size"] * m["n_embd"]
    return (
        f"The CPU's speed model is the larger for its vocabulary: the `cpu` profile's speed ladder reads GPT-2's BPE "
        f"tokens, and their embedding ({m['vocab_size']:,} x {m['n_embd']}, shared with the output layer) holds "
        f"{embedding / 1e6:.1f}M of its {m['params'] / 1e6:.1f}M parameters; the `reference` profile reads characters."
        "\n"
    )


def speedrun_block(sr: Speedrun) -> str:
    """The speedrun's record table and its findings, as results.md's section has them, links from the repo's root."""
    return "\n".join(["", *speedrun_table(sr), "", *(f"- {line}" for line in speedrun_findings(sr)), "", ""])


def compile_rule() -> str:
    """speedrun_12's rule in figures: each device kind's cold compilation, its saving a step, and the steps it needs."""
    parts = [
        f"{cost.cold_s:g} s of cold compilation against at most {1e3 * cost.saving_per_step_s:g} ms saved a step on a "
        f"{'GPU' if kind == 'cuda' else kind.upper()}: a run of {cost.pays_after_steps:,} steps or more compiles"
        for kind, cost in COMPILE_COSTS.items()
    ]
    return "; ".join(parts)


def host_memory_faults(runs: Path) -> str:
    """speedrun_13's effect in the committed run: minor page faults a training step, its parent's and its own."""
    folder = time_to_loss_dir(runs, LADDER)
    faults = {}
    for stage in ("speedrun_12_eager", "speedrun_13_host_memory"):
        record = read_record(folder / f"{stage}.json")
        faults[stage] = (record or {}).get("metrics", {}).get("minor_faults_per_step")
    if None in faults.values():
        return "its page faults a step are not in the committed run"
    before, after = faults.values()
    return f"{before:,.0f} minor page faults a training step before, {after:,.0f} after (the committed run, one seed)"


def try_command() -> str:
    """The README's try, fenced: the last speedrun stage's command (gpt/first_run.py:try_command)."""
    return "\n```bash\n" + " ".join(first_run.try_command(stages_of(LADDER)[-1])) + "\n```\n"


def try_first_run(runs: Path) -> str:
    """A first run of the try, from records/first_run.json: the runs of the newest's code, or the newest and one before.

    The runs of the newest's code (the same `code`: gpt/first_run.py:code_of) on its kind of CPU and cores are given as
    their median and range: they differ by the machine's state alone, and the newest alone would pick one draw of it.
    A ratio to speed_0's whole process in `runs` is given where both ran on one kind of CPU (machine.json's `cpu`;
    gpt/devices.py:same_cpu_kind). With one run of that code, the run before it is named where both name the same
    generation; a first run of a stage that is no longer the last says which it was. The runs on the committed run's
    kind of CPU come first, the ones its ratio holds for; a newer run on another kind is named after them."""
    entries = (read_record(first_run.RECORD) or {}).get("runs", [])
    if not entries:
        return "No first run of it has been timed yet"
    cpu = (read_record(runs / MACHINE_FILE) or {}).get("cpu")
    own = [i for i, e in enumerate(entries) if same_cpu_kind(cpu, e["cpu"])]
    end = (own or [len(entries) - 1])[-1] + 1  # the entries up to the newest on the committed run's kind, or all
    return first_runs_of(entries[:end], runs, cpu) + elsewhere(entries[-1], entries[end - 1])


def elsewhere(latest: dict, newest: dict) -> str:
    """The newest first run where it ran on another kind of CPU than the ones the README gives: which, and its time."""
    if latest is newest:
        return ""
    return (
        f". The newest first run, of `{latest['stage']}` at commit {latest['commit']}, ran on another kind of CPU, a "
        f"{latest['cores']}-core {latest['cpu']}: {latest['wall_s']:.1f} s launch to exit"
    )


def first_runs_of(entries: list[dict], runs: Path, cpu: str | None) -> str:
    """try_first_run's sentence for the last of `entries` and those of its code, kind of CPU and cores before it."""
    newest, last = entries[-1], stages_of(LADDER)[-1]
    who = "it" if newest["stage"] == last else f"`{newest['stage']}`, the last stage then,"
    split = ", ".join(f"{words} {newest['split'][key]:.1f}" for key, words in first_run.SPLIT if key in newest["split"])
    base_walls, _ = Speedrun(runs).walls(BASELINE)
    comparable = base_walls and same_cpu_kind(cpu, newest["cpu"])
    base = statistics.fmean(base_walls) if comparable else None
    if base:
        against = (
            f"`{BASELINE}`'s whole process in the committed run ({base:.0f} s, the mean of its {len(base_walls)} seeds)"
        )
    machine = f"a {newest['cores']}-core {newest['cpu']}"
    same = [
        e
        for e in entries
        if newest.get("code")
        and (e["stage"], e.get("code"), e["cores"]) == (newest["stage"], newest["code"], newest["cores"])
        and same_cpu_kind(e["cpu"], newest["cpu"], strict=True)
    ]
    if len(same) > 1:
        walls = sorted(e["wall_s"] for e in same)
        median = statistics.median(walls)
        commits = list(dict.fromkeys(e["commit"] for e in same))
        named = ", ".join(commits[:-1]) + " and " * (len(commits) > 1) + commits[-1]
        text = (
            f"{len(same)} first runs of {who} with empty caches, all of one code (what a stage runs, the same at "
            f"commit{'s' * (len(commits) > 1)} {named}), on {machine}, took {walls[0]:.1f}-"
            f"{walls[-1]:.1f} s launch to exit, median {median:.1f} s"
        )
        if base:
            text += f": {base / median:.1f}x ({base / walls[-1]:.1f}-{base / walls[0]:.1f}x) sooner than {against}"
        return text + (
            f"; they differ by the machine's state alone. The newest took {newest['wall_s']:.1f} s ({split}), "
            f"at commit {newest['commit']}"
        )
    text = (
        f"A first run of {who} with empty caches took {newest['wall_s']:.1f} s, launch to exit ({split}), at commit "
        f"{newest['commit']} on {machine}"
    )
    if base:
        text += f": {base / newest['wall_s']:.1f}x sooner than {against}"
    before = next((e for e in reversed(entries[:-1]) if same_cpu_kind(e["cpu"], newest["cpu"], strict=True)), None)
    if before:
        text += (
            f"; before it `{before['stage']}` took {before['wall_s']:.1f} s at commit {before['commit']} on a "
            f"{before['cores']}-core {before['cpu']}"
        )
    return text


def try_output(runs: Path) -> str:
    """What the README's try prints after its progress bar: the last speedrun stage's summary, from its record.

    The stage prints it from the record it writes (gpt/stage.py:print_loss_summary); here from the committed run's
    record of the same stage and seed, as if its --out were /tmp/try. Fenced inside the markers, which a code block
    would show."""
    stage = stages_of(LADDER)[-1]
    record = read_record(time_to_loss_dir(runs, LADDER) / f"{stage}.json")
    if record is None:  # a stage added since the committed run: its summary comes with the next whole run
        return f"\n```\nno committed record of {stage}: a whole ./run_all.sh writes the one this block quotes\n```\n"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        print_loss_summary(record, Path("/tmp/try") / LADDER)
    return "\n```\n" + text.getvalue().lstrip("\n") + "```\n"


def test_suite_time() -> str:
    """The test suite's time from a fresh clone, per CPU kind, newest kind first (records/test_suite.json).

    Each kind's newest timing, with its commit (gpt/suite_time.py writes them); the older ones stay in the record,
    which the sentence points to, so the README's first screen carries one figure a kind."""
    entries = (read_record(suite_time.RECORD) or {}).get("runs", [])
    kinds = list(dict.fromkeys(e["cpu"] for e in reversed(entries)))
    newest = [next(e for e in reversed(entries) if e["cpu"] == kind) for kind in kinds]
    parts = [f"on a {e['cores']}-core {e['cpu']}, {suite_time.summary(e)}" for e in newest]
    older = len(entries) - len(newest)
    if older:
        parts[-1] += f" ({older} earlier timing{'s' * (older > 1)}, each with its commit: `records/test_suite.json`)"
    return "; ".join(parts)


def blocks(runs: Path) -> dict[str, str]:
    """Each block's text, from the records in `runs`."""
    sr = Speedrun(runs)
    return {
        "faster-step-headline": faster_step_headline(LossRuns(runs)),
        "speedrun-headline": speedrun_headline(sr),
        "speedrun-table": speedrun_block(sr),
        "planner-headline": planner_headline(runs),
        "gpu-memory": gpu_memory_table(),
        "gpu-memory-peaks": gpu_memory_peaks(),
        "gpu-speedrun": gpu_speedrun_line(),
        "gpu-batch": gpu_batch_line(),
        "gpu-quick": gpu_quick_line(),
        **{f"gpu-quick-runs-{folder.name}": gpu_quick_runs(runs) for folder, _, runs in gpu_quick_runs_of()},
        "models": models_table(runs),
        "cpu-run-time": run_time(runs),
        "cpu-run-minutes": run_minutes(runs),
        "cpu-run-split": run_split(runs),
        "try-output": try_output(runs),
        "try-command": try_command(),
        "compile-rule": compile_rule(),
        "host-memory-faults": host_memory_faults(runs),
        "try-first-run": try_first_run(runs),
        "test-suite-time": test_suite_time(),
    }


def rewritten(text: str, runs: Path) -> str:
    """`text` with every generated block written anew from `runs`; an unknown block name is an error."""
    made = blocks(runs)

    def fill(m: re.Match) -> str:
        if m["name"] not in made:
            raise KeyError(f"README block {m['name']!r} has no generator (gpt/report/readme.py: {', '.join(made)})")
        return f"{m[1]}{made[m['name']]}{m[4]}"

    return BLOCK.sub(fill, text)


def rewrite_readme(readme: Path = README, runs: Path = README_RECORDS) -> Path:
    """Rewrite the README's generated blocks from `runs`, leaving the rest of it as it is."""
    write_atomically(readme, rewritten(readme.read_text(), runs))
    return readme

"""The quick run (`./run_all.sh --quick`): a first look at the ladders on a user's own machine, planned to fit a limit.

What it runs, in order: on a GPU a subset of the one-GPU tests (`pytest -m "gpu and quick"`, at most
GPU_TESTS_CAP_S), then the speedrun (speed_0 on one seed, every speedrun stage on one seed, no noise-scale
measurement), then the speed and fast ladders at QUICK_REPEATS timed repeats; with `--only memory` (or another
section) that section alone. The CPU runs the same order: one order is simpler to share than two, and nothing ties the
ladders to the speedrun (the speedrun trains its own speed_0 to a loss), so the headline goes first everywhere.

Before the first stage it plans (`Plan`): each stage run's expected seconds (`Figures`: the rules are there), kept
from the first while their sum fits the limit less the report's share (a stage that cannot run here is kept wherever it
stands, at its start-up, so that its record says why); the rest is left out, printed with the command that runs it.
`--dry-run` prints that plan and runs nothing. The plan reflows as the run goes: an item it left out runs after all
where the time left, less the kept items still to come, covers it (`Plan.fits_now`: the stages so far ran faster than
planned); one that does not fit is recorded as "not run" with that command. The limit is also kept while it runs
(`Deadline`): a stage still running when it comes is stopped and those after it recorded as not run; `--resume`
completes the run. At its end it writes <out>/quick_run.json (`write_summary`): its limit, plan and wall clock, and
each item's planned and measured seconds; a `--resume` adds its run to the list. Its records are real records, each
marked `run.quick`, kept in their own folder (runs/<profile>-<device>-quick by default) and never published over the
committed ones; `python -m gpt.report --runs <that folder>` makes their page. Its stage processes share this
machine's compile cache (torch.compile's, on disk): a stage loads what an earlier one, or an earlier run, compiled.
"""

import importlib.util
import os
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import torch

from gpt import optimizations
from gpt.committed_records import PUBLISHED, published_dir
from gpt.formatting import fmt_minutes as minutes
from gpt.ladder import ladder_of, stage_config, stages_of
from gpt.optimizations.compilation import compile_mode
from gpt.records import read_record, write_record
from gpt.supervision import TimeLimitReached, run_stage

SPEEDRUN = "speedrun"  # the ladder, and the folder of its records (gpt/records.py:time_to_loss_dir)
QUICK_REPEATS = 2  # timed repeats per stage: two give a spread; the profiles' own are 3 to 5
QUICK_WARMUP = 5  # warm-up steps at most: compilation and CUDA-graph recording happen in the first three
# The limit when none is given, in minutes: on a GPU what one lent H100 leaves, with room (issue 52); on a CPU what the
# cpu profile's quick run took on the 2-core machines this project is built on, with a margin (docs/running.md).
DEFAULT_LIMIT_MIN = {"cuda": 7.0, "cpu": 20.0}
REPORT_RESERVE = 0.05  # of the limit, kept for the report after the last stage
GPU_TESTS_CAP_S = 90.0  # the GPU tests' share of a quick run, at most: where they are stopped
# The one-GPU tests a quick run runs: those marked `quick` in tests/test_gpu.py, which start no stage process and train
# nothing to a loss (the quick run's own stages do both on the GPU).
GPU_TESTS_MARKERS = "gpu and quick"
GPU_TESTS = "gpu tests"  # their item's section in the plan
PLANNER = "memory planner"  # the section of the planner's reports, after the memory ladder (gpt/run_all.py)
# A gpt.memory process besides its report's own seconds: its imports, 2.7-4.0 s on the 2-core Zen 4 EPYC, which is also
# what a reused report costs in all (2.9 s there).
PLANNER_START_S = 5.0
GPU_TESTS_FILE = "gpu_tests.json"  # in the run's folder: their command, exit code, seconds and closing line
RUN_FILE = "quick_run.json"  # in the run's folder: each quick run's plan and wall clocks (write_summary)
NOT_RUN_PREFIX = "not run: the quick run's "  # the reason of every record of a stage a quick run had no time for
NOT_RUN = NOT_RUN_PREFIX + "{limit} limit was reached first (--resume runs it)"
NOT_PLANNED = NOT_RUN_PREFIX + "plan for {limit} had no room for it (`{command}` runs it)"
STOPPED = "stopped at the quick run's {limit} limit (--resume runs it again)"

# The GPU kinds with committed records (records/<kind>-<date>/, the reference profile); another GPU is planned as the
# first, the slower of the two.
GPU_KINDS = ("H100", "H200")
# A stage process's seconds before its first step on a GPU machine (imports, CUDA's context, the data set): not measured
# there; the CPU's speedrun_13 takes 3.6 s (docs/speedrun.md), and a CUDA context adds seconds.
PROCESS_START_S = 10.0
# A timed stage's wall clock on a GPU besides its warm-up and timed repeats (start-up, profiled steps, memory step,
# record), from the H200 run (records/h200-2026-11-27/note.md): the speed and fast ladders took 369 s for 10 stages
# whose warm-ups and repeats took 181 s, 19 s a stage; the memory ladder 370 s for memory_0-2 (266 s) and a cut
# memory_3, at most 35 s a stage.
TIMED_REST_S = {"speed": 19.0, "fast": 19.0, "memory": 35.0, "lean": 35.0}
# A run to a loss's evaluations, as a share of its training: the reference profile's 40 evaluations of 512 windows
# are forward passes only, 8.5% of its 2500 training steps of 32 windows (a forward pass a third of a step).
EVAL_SHARE = 0.1


@dataclass
class Deadline:
    """The quick run's limit: when it started, how long it may last, and the share kept for the report."""

    limit_s: float
    start: float
    reserve: float = REPORT_RESERVE

    @classmethod
    def starting_now(cls, limit_min: float) -> "Deadline":
        return cls(60 * limit_min, time.monotonic())

    @property
    def stages_end(self) -> float:
        """When the last stage must have ended: the report needs the rest."""
        return self.start + self.limit_s * (1 - self.reserve)

    def left(self) -> float:
        return self.stages_end - time.monotonic()

    def passed(self) -> bool:
        return self.left() <= 0

    @property
    def label(self) -> str:
        return minutes(self.limit_s)


def stage_arguments(profile_settings: dict) -> list[str]:
    """The extra arguments of a timed stage in a quick run: fewer repeats and warm-up steps than its profile's."""
    return [
        "--repeats",
        str(min(QUICK_REPEATS, profile_settings["repeats"])),
        "--warmup-iters",
        str(min(QUICK_WARMUP, profile_settings["warmup_iters"])),
    ]


def mark(record_file: Path, wall_s: float, quick: bool) -> None:
    """Add the stage process's wall clock, launch to exit, and whether it ran in a quick run, to its record."""
    record = read_record(record_file)
    if record is not None:
        write_record(record_file, {**record, "run": {"quick": quick, "wall_s": round(wall_s, 2)}})


def left_out(record: dict) -> bool:
    """Whether a record is a quick run's "not run": it had no time for the stage, which says nothing of this machine."""
    return record.get("status") == "skipped" and record.get("reason", "").startswith(NOT_RUN_PREFIX)


# ---- the plan ------------------------------------------------------------------------------------------------------


def gpu_kind(name: str) -> str:
    """The committed GPU kind a device's name (torch.cuda.get_device_name) is planned as: its own, or the first."""
    return next((kind for kind in GPU_KINDS if kind in name.upper()), GPU_KINDS[0])


def committed_folders(profile: str, device: str, kind: str | None) -> tuple[list[Path], list[Path]]:
    """The committed records a plan reads: this machine's kind's folders, newest first, and the other GPU kinds'.

    On a GPU (the reference profile) a kind has a folder a run (records/<kind>-<date>), and a newer one may hold only
    some stages (a quick run's): every one is read. Elsewhere the profile and device's one folder."""
    if device != "cuda" or profile != "reference":
        return [published_dir(profile, device)], []
    newest_first = {k: sorted(PUBLISHED.glob(f"{k.lower()}-*"), reverse=True) for k in GPU_KINDS}
    kind = kind or GPU_KINDS[0]
    return newest_first[kind], [folder for k in GPU_KINDS if k != kind for folder in newest_first[k]]


def ok_record(path: Path) -> dict | None:
    record = read_record(path)
    return record if record and record.get("status") == "ok" else None


@dataclass(frozen=True)
class Warmed:
    """A recorded figure whose compile was warm: the stage run that fills the cache it loaded, and what a cold one adds.

    `by` is None where no stage before it in its record's run is known to have compiled: it compiles cold wherever it
    runs first (speedrun_1 on the CPU loads what the time-to-loss section of a whole run compiled). `seen` says whether
    its record's run showed it loading what `by` compiled (`by` compiled cold there); else `by` is only the furthest
    ancestor that compiled, and what it loaded may have come from an earlier run on that machine."""

    by: Path | None  # the record, relative to its folder, of the stage whose compile it loaded
    cold_s: float  # a cold compile's first step, less its own
    seen: bool = False  # `by` compiled cold in the record's run: the record loaded its graphs


def first_step_cost(record: dict) -> float:
    """A record's compile seconds: a timed stage's `compile_s`, a run to a loss's `first_step_s`."""
    m = record["metrics"]
    return m.get("compile_s") or m.get("first_step_s") or 0.0


def warmed(record: dict, folder: Path, rel: Path) -> Warmed | None:
    """Where `record` (at folder/rel) compiled warm: the stage before it that filled the cache, a cold compile's cost.

    Its ancestors (parent, its parent, ...) in the same folder: the nearest that compiled cold filled it, at that
    cost; without one, the furthest that compiled (warm itself, from outside the ladder) fills it in a run where it
    goes first, and a cold compile costs what `cold_compile_seconds` finds."""
    if record["metrics"].get("compile_cache") != "warm":
        return None
    own, ancestor, furthest = first_step_cost(record), record, None
    while (parent := ancestor.get("parent")) and (ancestor := ok_record(folder / rel.parent / f"{parent}.json")):
        state = ancestor["metrics"].get("compile_cache")
        if state == "cold":
            return Warmed(rel.parent / f"{parent}.json", max(0.0, first_step_cost(ancestor) - own), seen=True)
        furthest = rel.parent / f"{parent}.json" if state else furthest
    return Warmed(furthest, max(0.0, cold_compile_seconds(folder, rel) - own))


def is_cold(record: dict | None) -> bool:
    """Whether a stage's record (None where none finished) compiled every graph anew, loading none from the cache."""
    return bool(record) and record.get("metrics", {}).get("compile_cache") == "cold"


def cold_compile_seconds(folder: Path, rel: Path) -> float:
    """What a cold compile of the stage at folder/rel costs, from the records: the first that has a cold one.

    The slowest cold first step beside it in `folder`; else, in the other committed runs of that folder's machine
    (`same_machine_runs`, newest first), the stage's own where it compiled cold, or the slowest cold one beside it. A
    run whose caches were warm from an earlier one has no cold figure (records/cpu-cpu of c42133b: all 29 warm, 2-3 s
    a first step where a cold one took 17-30 s in the run of c9ed59d); with none anywhere, the slowest compile beside
    it, a floor."""
    for run in [folder, *same_machine_runs(folder)]:
        if run != folder and is_cold(own := ok_record(run / rel)):
            return first_step_cost(own)
        beside = [r for path in sorted((run / rel.parent).glob("*.json")) if is_cold(r := ok_record(path))]
        if beside:
            return max(first_step_cost(r) for r in beside)
    return max(compile_seconds(folder), default=0.0)


def same_machine_runs(folder: Path) -> list[Path]:
    """The other runs beside `folder` whose machine.json names its profile, device, CPU and torch, newest first."""
    machine = read_record(folder / "machine.json") or {}
    same = ("profile", "device", "cpu", "torch")  # another torch compiles other graphs at another pace
    runs = [
        (m.get("finished") or "", run)
        for run in folder.parent.iterdir()
        if run != folder
        and run.is_dir()
        and (m := read_record(run / "machine.json"))
        and all(m.get(key) == machine.get(key) for key in same)
    ]
    return [run for _, run in sorted(runs, reverse=True)]


def compile_cache_is_empty() -> bool:
    """Whether torch.compile's on-disk caches on this machine hold no compiled graph: a fresh machine's first run.

    Inductor's FX graph cache and AOTAutograd's, in TORCHINDUCTOR_CACHE_DIR or Inductor's default folder. Their
    entries are not kept per torch version, so a machine that compiled with another torch reads as not empty."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    root = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
    return not any(any((root / kind).glob("*")) for kind in ("fxgraph", "aotautograd"))


@dataclass
class Figures:
    """Where a quick run's plan takes a stage run's expected seconds (launch to exit) from: the first rule that has one.

    1. a stage that cannot run on the machine planned for (`cannot_run`): PROCESS_START_S, the start-up of a process
       that then records itself skipped, saying why;
    2. this folder's earlier quick record of it, if it finished: its wall clock (`run.wall_s`), measured here;
    3. the committed records of it on this kind of device, the newest folder first: its wall clock if it has one
       (records/cpu-cpu: a whole run's, with more repeats than a quick run's: an upper bound; a GPU's quick run's),
       else TIMED_REST_S + its warm-up (`warmup_s`, compilation included, over at least QUICK_WARMUP steps) +
       QUICK_REPEATS x its `seconds_mean`; where that record compiled warm, from the cache a stage before it filled,
       the plan adds a cold compile unless that stage runs before it in this run (Warmed, Plan);
    4. another GPU kind's committed record of it, as rule 3 reads it: a wall clock measured on another GPU is nearer
       than rule 5's model (which took the H100's speedrun for a third slower than it ran);
    5. on a GPU, a run to a loss no record has: its budget's steps at speed_0's recorded step time (this kind's newest
       record of it), times the stage's share of speed_0's training seconds in records/cpu-cpu, plus EVAL_SHARE of that
       for evaluations, PROCESS_START_S, and a cold compile (that folder's slowest `compile_s`) if the stage compiles;
    6. a timed stage: its ladder's slowest stage by rules 2 to 4;
    7. none (a profile without records, as the tests' smoke): 0 s, the limit alone bounds it.

    The GPU tests' seconds (`gpu_tests`): this kind's newest committed run of them (gpu_tests.json), else their cap;
    the memory planner's reports' (`planner`): their own rules.
    """

    own: Path  # this run's folder
    committed: list[Path]  # this kind's committed folders, newest first (committed_folders)
    profile: str
    device: str
    others: list[Path] = field(default_factory=list)  # the other GPU kinds' committed folders (committed_folders)
    planned_gpus: int | None = None  # a GPU planned from elsewhere (--dry-run --gpu): its GPUs; None: this machine's
    reasons: dict = field(default_factory=dict, repr=False)  # cannot_run's answers: the plan asks twice a stage

    def seconds(self, stage: str, rel: Path, to_a_loss: bool) -> tuple[float, str, Warmed | None]:
        """A stage run's expected seconds, the rule they come from, and whether they assume a warm compile (Warmed).

        `rel`: its record's path in the run's folder."""
        rules = (self.start_up_only, self.measured, self.recorded, self.elsewhere, self.trained_to_a_loss, self.slowest)
        for rule in rules:
            if found := rule(stage, rel, to_a_loss):
                seconds, why, *warm = found
                return seconds, why, warm[0] if warm else None
        return 0.0, "no figure: the limit bounds it", None

    def config(self, stage: str, rel: Path, to_a_loss: bool):
        """The stage's settings (a TrainConfig) in the run: on the speedrun's task where its record is in its folder."""
        task = rel.parts[0] == SPEEDRUN
        return stage_config(stage, self.profile, to_a_loss, speedrun_task=task, device=self.device)

    def cannot_run(self, stage: str, rel: Path, to_a_loss: bool) -> str | None:
        """Why the stage cannot run on the machine planned for, or None.

        This machine says it as the stage will (optimizations.why_cannot_run); of a GPU planned from elsewhere (--gpu)
        only its number of GPUs is known."""
        key = (stage, rel, to_a_loss)
        if key not in self.reasons:
            cfg = self.config(stage, rel, to_a_loss)
            if self.planned_gpus is None:
                self.reasons[key] = optimizations.why_cannot_run(cfg, self.device)
            elif cfg.world_size > self.planned_gpus:
                self.reasons[key] = f"needs {cfg.world_size} GPUs, planned for {self.planned_gpus}"
            else:
                self.reasons[key] = None
        return self.reasons[key]

    def start_up_only(self, stage, rel, to_a_loss):
        if reason := self.cannot_run(stage, rel, to_a_loss):
            return PROCESS_START_S, f"start-up only, then it records itself skipped: {reason}"

    def measured(self, stage, rel, to_a_loss):
        record = ok_record(self.own / rel)
        if record and record.get("run", {}).get("quick") and record["run"].get("wall_s"):
            return record["run"]["wall_s"], "this folder's last quick run"

    def recorded(self, stage, rel, to_a_loss):
        return committed_figure(stage, rel, self.committed)

    def elsewhere(self, stage, rel, to_a_loss):
        return committed_figure(stage, rel, self.others)

    def trained_to_a_loss(self, stage, rel, to_a_loss):
        if self.device != "cuda" or not to_a_loss:
            return None
        baseline_rel = f"{stages_of('speed')[0]}.json"
        found = next(((f, r) for f in self.committed if (r := ok_record(f / baseline_rel))), None)
        if found is None:
            return None
        folder, baseline = found
        cfg, budget = (self.config(s, rel, True) for s in (stage, baseline["stage"]))
        steps, step_s = budget.train_tokens // budget.tokens_per_step, baseline["metrics"]["step_time_s"]
        share = cpu_share(rel)
        compiles = compile_mode(cfg, torch.device("cuda")) is not None  # the rule may keep a short run eager
        compile_s = max(compile_seconds(folder), default=0.0) if compiles else 0.0
        seconds = PROCESS_START_S + compile_s + (1 + EVAL_SHARE) * steps * step_s * share
        return seconds, (
            f"{folder.name}: speed_0's {steps} steps x {1000 * step_s:.1f} ms"
            + (f" x {share:.2f} (its cpu-cpu share)" if share != 1 else "")
            + f" + evaluations + start-up {PROCESS_START_S:g}"
            + (f" + compile {compile_s:.0f}" if compile_s else "")
        )

    def slowest(self, stage, rel, to_a_loss):
        if to_a_loss:
            return None
        figures = [self.any_record(s, Path(f"{s}.json")) for s in stages_of(ladder_of(stage))]
        if figures := [f[0] for f in figures if f]:
            return max(figures), f"{ladder_of(stage)}'s slowest recorded stage"

    def any_record(self, stage, rel):
        """Rules 2 to 4: a timed stage's figure from any record of it."""
        return self.measured(stage, rel, False) or self.recorded(stage, rel, False) or self.elsewhere(stage, rel, False)

    def planner(self, file: str, reused: Path | None, machine_independent: bool, bound: str | None = None):
        """A memory-planner report's expected seconds, launch to exit, and their rule: the first that has a figure.

        `file`: its record's name in a run's folder. The rules:
        1. reused (`reused`: the committed record it will copy, computed from the same code, torch and arguments):
           PLANNER_START_S, the process's start-up;
        2. computed: the report's `seconds` in this folder (an earlier quick run's), then in this kind's committed
           folders, then, for one that does not depend on the machine (reference, fit), in the committed CPU run's (a
           2-core machine's); plus PLANNER_START_S;
        3. on a GPU, the `seconds` of the report in `bound` (compare: the reference report, which estimates the same
           five memory stages, the reference profile's for CUDA, three ways each): an upper bound;
        4. none: 0 s, the limit bounds it."""
        if reused:
            return PLANNER_START_S, f"start-up only: reused from {reused.parent.name}, its code and torch unchanged"
        cpu_run = published_dir("cpu", "cpu")
        found = [(folder, file) for folder in [self.own, *self.committed] + ([cpu_run] * machine_independent)]
        if bound and self.device == "cuda":
            found += [(folder, bound) for folder in [*self.committed, cpu_run]]
        for folder, name in found:
            if (seconds := (read_record(folder / name) or {}).get("seconds")) is not None:
                where = "this folder's last run" if folder == self.own else folder.name
                of = f" its {Path(name).stem} (an upper bound)" if name != file else ""
                return (
                    PLANNER_START_S + seconds,
                    f"{where}:{of} {seconds:.0f} s computing + start-up {PLANNER_START_S:g}",
                )
        return 0.0, "no figure: the limit bounds it"

    def gpu_tests(self) -> tuple[float, str]:
        """The GPU tests' expected seconds and where they come from: this kind's committed run of them, else the cap."""
        for folder in self.committed:
            if (result := read_record(folder / GPU_TESTS_FILE)) and result.get("seconds"):
                return min(result["seconds"], GPU_TESTS_CAP_S), f"{folder.name}'s run of them"
        return GPU_TESTS_CAP_S, "their cap"


def committed_figure(stage: str, rel: Path, folders: list[Path]) -> tuple[float, str, Warmed | None] | None:
    """A stage run's expected seconds from the first of `folders` with a finished record of it (Figures' rule 3).

    With them, where that record's first step loaded its compiled graphs from the cache a stage before it filled
    (`warmed`): the plan adds a cold compile unless that stage runs before it (Plan)."""
    for folder in folders:
        record = ok_record(folder / rel)
        if record and (wall := record.get("run", {}).get("wall_s")):
            return wall, f"{folder.name}'s wall clock", warmed(record, folder, rel)
        if record and (m := record["metrics"]).get("seconds_mean") is not None:
            rest = TIMED_REST_S[ladder_of(stage)]
            return (
                rest + m["warmup_s"] + QUICK_REPEATS * m["seconds_mean"],
                f"{folder.name}: {rest:g} + warm-up {m['warmup_s']:.1f} + {QUICK_REPEATS} x {m['seconds_mean']:.2f}",
                warmed(record, folder, rel),
            )
    return None


def compile_seconds(folder: Path):
    """The `compile_s` of every finished record in `folder`."""
    for path in sorted(folder.glob("*.json")):
        if (record := ok_record(path)) and record.get("metrics", {}).get("compile_s"):
            yield record["metrics"]["compile_s"]


def cpu_share(rel: Path) -> float:
    """A run to a loss's training seconds over speed_0's, in the committed CPU run (1 where it has none)."""
    folder = published_dir("cpu", "cpu")
    stage, baseline = ok_record(folder / rel), ok_record(folder / "time_to_loss" / f"{stages_of('speed')[0]}.json")
    if stage is None or baseline is None:
        return 1.0
    return stage["metrics"]["train_seconds"] / baseline["metrics"]["train_seconds"]


@dataclass
class Item:
    """One thing in a quick run's plan: a stage run (its record's path) or the GPU tests (none)."""

    section: str
    name: str
    seconds: float
    why: str  # the rule the seconds come from
    command: str  # what runs it (its section) alone, said where the plan leaves it out
    record: Path | None = None
    cannot_run: str | None = None  # why it cannot run here: planned whatever the room, so that its record says why
    reflowed: bool = False  # the plan left it out, and it ran because the time left had room for it (Plan.fits_now)
    wall_s: float | None = None  # measured, launch to exit, where it ran
    warmed: Warmed | None = None  # its seconds assume the compile cache its parent's run fills (Figures.seconds)

    def outcome(self) -> dict:
        """The item in quick_run.json: what was planned, whether it ran, and for how long."""
        ran = self.wall_s is not None
        return {
            "section": self.section,
            "name": self.name,
            "planned_s": round(self.seconds, 1),
            "why": self.why,
            "ran": ran,
            "reflowed": self.reflowed,
            **({"wall_s": round(self.wall_s, 1)} if ran else {}),
        }


@dataclass
class Plan:
    """A quick run's items in the order they run, and those it keeps: what fits in the stages' time, from the first.

    A stage that cannot run here is kept wherever it stands, its seconds (its start-up) counted first: left out, its
    record would say "not run" instead of why. The items left out may still run, where the time left has room for
    them when their turn comes (`fits_now`)."""

    items: list[Item]
    budget_s: float  # the limit less the report's share
    cold_cache: bool = False  # the machine's compile cache is empty (compile_cache_is_empty): nothing loads warm
    kept: list[Item] = field(init=False)
    dropped: list[Item] = field(init=False)

    def __post_init__(self):
        total = sum(item.seconds for item in self.items if item.cannot_run)
        ahead, full = [], False  # the stage runs kept so far; whether one has not fit (the rest are left out)
        for item in (item for item in self.items if not item.cannot_run):
            self.cold_compile(item, ahead)
            full = full or total + item.seconds > self.budget_s
            if not full:
                total += item.seconds
                ahead.append(item)
        self.kept = [item for item in self.items if item.cannot_run or item in ahead]
        self.dropped = [item for item in self.items if item not in self.kept]

    def cold_compile(self, item: Item, ahead: list[Item]) -> Item:
        """The item, a cold compile added where its seconds assume a warm one and what warms it does not run first.

        A stage whose first step loaded what its parent compiled, planned without the parent before it; on a machine
        whose compile cache is empty, also one whose record loaded graphs no stage of its run was seen to compile."""
        warm = item.warmed
        if not warm or not warm.cold_s:
            return item
        if warm.by is None:
            why = "no stage before it compiles its graphs"
        elif self.cold_cache and not warm.seen:
            why = "this machine's compile cache is empty, and no stage before it was seen to compile its graphs"
        elif item.record.parent / warm.by.name not in [i.record for i in ahead]:
            why = f"{warm.by.stem}, which compiles its graphs, does not run before it"
        else:
            return item
        item.seconds += warm.cold_s
        item.why += f" + a cold compile {warm.cold_s:.0f} ({why})"
        return item

    def item_of(self, record: Path | None) -> Item | None:
        """The item of a stage run's record (None: the GPU tests'), or None if the plan has none."""
        return next((item for item in self.items if item.record == record), None)

    def dropped_item(self, record: Path) -> Item | None:
        """The item of a stage run the plan leaves out, or None if it runs."""
        item = self.item_of(record)
        return item if item in self.dropped else None

    def fits_now(self, item: Item, left_s: float) -> bool:
        """Whether an item the plan left out runs after all: the time left, less the kept items after it, covers it.

        The stages so far took less than planned, say. Only what comes later is counted: the items keep their order."""
        later = self.items[self.items.index(item) + 1 :]
        return left_s - sum(i.seconds for i in later if i in self.kept) >= item.seconds

    def runs(self, section: str) -> bool:
        return any(item.section == section for item in self.kept)


def print_plan(plan: Plan, limit_label: str, source: str) -> None:
    """The plan, one line an item with its expected seconds and their rule, the left-out sections, then the total."""
    print(f"== quick run: a first look within {limit_label} (--time-limit), every stage a real record marked quick")
    print(f"   the plan, from {source} (expected seconds: gpt/quick_run.py's Figures):")
    for item in plan.kept:
        print(f"   {minutes(item.seconds):>10}  {item.section}: {item.name}  ({item.why})")
    for section in dict.fromkeys(item.section for item in plan.dropped):
        left = [item for item in plan.dropped if item.section == section]
        expected = minutes(sum(item.seconds for item in left))
        commands = "; ".join(dict.fromkeys(item.command for item in left))  # a section's, or each planner report's
        print(f"   not run, no room in the plan: {section}, {len(left)} of its runs ({expected}): {commands}")
    print(f"total: {minutes(sum(item.seconds for item in plan.kept))}", flush=True)


# ---- the GPU tests and the compile cache -------------------------------------------------------------------------


def gpu_tests_command() -> list[str]:
    """The GPU tests' command: `pytest -m "gpu and quick"` on tests/test_gpu.py, side by side where xdist is."""
    cmd = [sys.executable, "-m", "pytest", "-m", GPU_TESTS_MARKERS, "-q", "-rs"]  # -rs: the log says why tests skipped
    cmd += ["-p", "no:cacheprovider", "tests/test_gpu.py"]
    if importlib.util.find_spec("xdist"):  # pytest-xdist: the GPU tests side by side, as many as there are cores / 4
        cmd += ["-n", str(max(1, (os.cpu_count() or 4) // 4))]
    return cmd


def run_gpu_tests(out: Path, deadline: Deadline) -> dict:
    """The quick subset of the one-GPU tests, stopped with everything it started at its cap (GPU_TESTS_CAP_S).

    It runs in a process group of its own (as a stage does: gpt/supervision.py), so that at its cap the tests' stage
    processes stop with it. Its closing line and exit code go to <out>/gpu_tests.json, its output to gpu_tests.log."""
    cap = min(GPU_TESTS_CAP_S, deadline.left())
    log, cmd = out / "gpu_tests.log", gpu_tests_command()
    print(f"[gpu tests] {shlex.join(cmd[1:])}  (at most {minutes(cap)}; log: {log})", flush=True)
    t0 = time.monotonic()
    try:
        rc = run_stage(cmd, log, lambda seconds: None, Deadline(cap, t0, reserve=0.0))
    except TimeLimitReached:
        rc = None
    summary = closing_line(log.read_text(errors="replace"))
    result = {
        "command": shlex.join(cmd[1:]),
        "exit_code": rc,
        "seconds": round(time.monotonic() - t0, 1),
        "summary": summary if rc is not None else f"stopped at {minutes(cap)}; last line: {summary}",
    }
    write_record(out / GPU_TESTS_FILE, result)
    print(f"[gpu tests] {result['summary']}", flush=True)
    return result


def closing_line(output: str) -> str:
    """pytest's closing line ('== 30 passed, 6 skipped in 101.97s =='), or the output's last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    closing = [line for line in lines if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    return (closing or lines or [""])[-1].strip("= ")


def write_summary(out: Path, deadline: Deadline, plan: Plan, resume: bool) -> Path:
    """<out>/quick_run.json, at a quick run's end: its limit, plan and wall clock, and each item planned and measured.

    Written atomically, as a record is; a --resume into the folder adds its run to the list the earlier ones left."""
    wall_s = time.monotonic() - deadline.start
    ended = datetime.now(UTC)
    run = {
        "limit_s": deadline.limit_s,
        "planned_s": round(sum(item.seconds for item in plan.kept), 1),
        "started": (ended - timedelta(seconds=wall_s)).isoformat(timespec="seconds"),
        "ended": ended.isoformat(timespec="seconds"),
        "wall_s": round(wall_s, 1),
        "items": [item.outcome() for item in plan.items],
    }
    path = out / RUN_FILE
    earlier = (read_record(path) or {}).get("runs", []) if resume else []
    return write_record(path, {"runs": [*earlier, run]})

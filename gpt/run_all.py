"""The main job behind `./run_all.sh`: the four timed ladders, the training to a loss, the speedrun, results.md.

Every stage of the four timed ladders, in order, each in its own process, then the speed and fast stages trained to a
loss (records in <out>/time_to_loss/), then the speedrun (records in <out>/speedrun/), then results.md.

    ./run_all.sh [--profile P] [--only speed|fast|memory|lean|time_to_loss|speedrun] [--device auto|cpu|cuda]
                  [--wandb MODE] [--out DIR] [--resume] [--no-profiler] [--fresh]
                  [--quick [--time-limit MINUTES] [--dry-run [--gpu H100|H200]]]

Each stage is its stage script (the same command a person would type), with its output in <out>/<stage>.log
and its JSON record in <out>/<stage>.json. The stage scripts write records for what they can tell (ok,
oom, failed, skipped); a stage that dies without one (killed, crashed interpreter) gets a `failed` record
from here. Ctrl-C (or SIGTERM) stops the running stage and everything it started, keeps every finished
record, and still writes the report; `--resume` then runs only the stages still missing. The results no machine
changes (the planner's H100 estimates, the noise-scale curve) are reused from records/ while their code is unchanged
(gpt/record_reuse.py); `--fresh` computes them anew.
"""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import torch

from gpt import machine_cache, ngram_floor, optimizations, quick_run
from gpt.command_line import add_shared_options
from gpt.committed_records import publish, published_dir
from gpt.data import REPO_ROOT, prepare_if_missing
from gpt.devices import cpu_kind, device_name, device_type, resolve_device
from gpt.errors import UserError, exit_on_user_error
from gpt.flops import calibrate_cpu_peaks, matmul_rate, peak_label
from gpt.formatting import fmt_mib, fmt_num
from gpt.ladder import STAGES_DIR, base_ladder, ladder_names, ladder_of, stage_config, stages_of, timed_ladders
from gpt.loss_curve import BASELINE_SEEDS, SPEEDRUN_SEEDS, TARGET_AT, baseline_model_loss, target_from
from gpt.optimizations.chunked_loss import LOSS_CACHE
from gpt.optimizations.fused_attention import ATTENTION_CACHE
from gpt.records import (
    environment,
    read_record,
    record_path,
    speedrun_baseline_dir,
    time_to_loss_dir,
    writable_dir,
    write_record,
)
from gpt.report.document import write_report
from gpt.report.memory_planner import MACHINE_INDEPENDENT, report_file
from gpt.report.readme import README_RECORDS, rewrite_readme
from gpt.report.rows import MACHINE_FILE
from gpt.report.speedrun import NOISE_SCALE_FILE
from gpt.settings_profiles import PROFILES, default_profile, profile_settings, speedrun_task_is_time_to_loss
from gpt.stage import unfinished_record
from gpt.supervision import Progress, TimeLimitReached, clock, last_line, lock_output, run_stage

KEEP_ON_RESUME = ("ok", "oom", "skipped")  # a final answer for this machine; `failed` is retried
TIME_TO_LOSS = "time_to_loss"  # the speed and fast stages trained to a loss
SPEEDRUN = "speedrun"  # the ladder judged by the time to speed_0's model (gpt/ladder.py)
SECTIONS = [*timed_ladders(), TIME_TO_LOSS, SPEEDRUN]
QUICK_SECTIONS = [SPEEDRUN, "speed", "fast"]  # a quick run's, in order (gpt/quick_run.py)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="./run_all.sh", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--profile",
        choices=list(PROFILES),
        help="settings profile (default: reference with CUDA, cpu without; smoke: tiny shapes, a few minutes in all)",
    )
    p.add_argument(
        "--only",
        choices=SECTIONS,
        help="run one ladder only, only the training to a loss, or only the speedrun (with speed_0's seeds)",
    )
    add_shared_options(p)
    p.add_argument(
        "--out",
        type=Path,
        help="records, logs and results.md (default: runs/<profile>-<device>, with the JSON records "
        "copied to records/<profile>-<device>/ and results.md written from there)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip stages that already have an ok/oom/skipped record for this profile and device",
    )
    p.add_argument(
        "--fresh",
        action="store_true",
        help="compute the machine-independent results anew (the H100 memory estimates, the noise-scale "
        "curve) instead of reusing the committed ones while their code is unchanged (gpt/record_reuse.py)",
    )
    p.add_argument(
        "--no-profiler", action="store_true", help="no profiled steps after timing: no time breakdown, no traces"
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a first look, planned to fit a time limit: on a GPU some of its tests, then the speedrun on one seed "
        f"and the speed and fast ladders at {quick_run.QUICK_REPEATS} repeats (with --only: that section); records "
        "in runs/<profile>-<device>-quick, never published (gpt/quick_run.py)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the quick run's plan (each stage run's expected seconds, what does not fit) and run nothing",
    )
    p.add_argument(
        "--gpu",
        choices=quick_run.GPU_KINDS,
        help="with --dry-run: plan for this GPU from its committed records, on any machine",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        metavar="MINUTES",
        help="the quick run's limit (default: "
        + ", ".join(f"{m:g} min on {d}" for d, m in quick_run.DEFAULT_LIMIT_MIN.items())
        + ")",
    )
    args = p.parse_args(argv)
    for option, given in (("--time-limit", args.time_limit is not None), ("--dry-run", args.dry_run)):
        if given and not args.quick:
            p.error(f"{option} is the quick run's: add --quick")
    if args.gpu and not args.dry_run:
        p.error("--gpu plans for a GPU that is not here: add --dry-run")
    if args.time_limit is not None and not args.time_limit > 0:
        p.error(f"--time-limit must be a positive number of minutes, got {args.time_limit:g}")
    return args


def needs_run(record: dict | None, profile: str, device: str, job: "Job | None" = None) -> bool:
    """Whether the stage of a record must run (again): False only for a record that --resume keeps.

    --resume keeps a record only if it is a final answer measured with the same profile and device, and, for a
    skipped stage, only the stage's own, while it still cannot run here (a library installed since, a second GPU): a
    quick run's "not run" (it had no time for the stage) is no answer, even for a stage that cannot run here."""
    if record is None or record.get("status") not in KEEP_ON_RESUME or record.get("profile") != profile:
        return True
    measured_on = record.get("device", {}).get("type") or record.get("config", {}).get("device")
    if measured_on not in (device, "auto"):
        return True
    if record["status"] != "skipped":
        return False
    return quick_run.left_out(record) or (job is not None and still_runs(job, profile, device))


def still_runs(job: "Job", profile: str, device: str) -> bool:
    """Whether the stage of `job` can run on this machine now (no reason to skip it)."""
    return optimizations.why_cannot_run(job.config(profile, device), device) is None


def prepare_data(profile: str, sections: list[str]) -> None:
    """Prepare the data sets the profile reads, if missing (prepare.py writes meta.json last)."""
    dirs = {
        REPO_ROOT / profile_settings(profile, base_ladder(s) if s in timed_ladders() else s)["data_dir"]
        for s in sections
    }
    for data_dir in sorted(dirs):
        prepare_if_missing(data_dir)


def say_what_cannot_run(jobs: list["Job"], profile: str, device: str) -> None:
    """One line for each stage that cannot run here, before the first stage runs (its record says it again)."""
    for job in jobs:
        if reason := optimizations.why_cannot_run(job.config(profile, device), device):
            print(f"   {job.name} cannot run here: {reason}")


def stage_command(stage: str, profile: str, device: str, wandb: str, out: Path) -> list[str]:
    return [
        sys.executable,
        str(STAGES_DIR / f"{stage}.py"),
        "--profile",
        profile,
        "--device",
        device,
        "--wandb",
        wandb,
        "--out",
        str(out),
    ]


def write_machine(out: Path, profile: str, device: str) -> None:
    """What the report's header needs about this machine and that no single record holds."""
    env = environment()
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    out.mkdir(parents=True, exist_ok=True)
    write_record(
        out / MACHINE_FILE,
        {
            "cpu_count": os.cpu_count(),
            "cpu": cpu_kind(),  # its model and matrix units: a first run (gpt/first_run.py) compares on the same kind
            "gpus": gpus,
            "python": env["python"],
            "torch": env["torch"],
            "platform": env["platform"],
            "git_commit": env["git_commit"],
            "profile": profile,
            "device": device,
            "started": env["time"],
            "load_average": round(os.getloadavg()[0], 2),
        },
    )


def measure_cpu_peaks(out: Path, rounds: int) -> None:
    """The CPU's matmul peaks, measured afresh before the first stage while nothing else runs.

    Every stage reads them from the cache for its MFU (single-process stages use all threads, torchrun's ranks one)."""
    threads = sorted({torch.get_num_threads(), 1}, reverse=True)
    print(f"measuring this CPU's matmul peaks (fp32 and bf16, best of {rounds} rounds)...", flush=True)
    peaks = calibrate_cpu_peaks(threads, rounds=rounds)
    print("  " + ", ".join(f"{k}: {v / 1e9:,.1f} GFLOP/s" for k, v in peaks.items()))
    _update_machine(out, cpu_peaks_gflops={k: round(v / 1e9, 1) for k, v in peaks.items()}, cpu_peak_rounds=rounds)


def remeasure_cpu_peak(out: Path, rounds: int) -> None:
    """The CPU's fp32 matmul peak at all threads, measured once more after the last stage.

    The report says if the host ran faster then than at the start, i.e. if the MFU figures (against the start's peak)
    may be too high."""
    threads = torch.get_num_threads()
    flops = matmul_rate(torch.float32, seconds=rounds, rounds=rounds)
    print(f"this CPU's fp32 matmul peak after the stages: {flops / 1e9:,.1f} GFLOP/s ({threads} threads)")
    _update_machine(out, cpu_peak_end_gflops={peak_label(torch.float32, threads): round(flops / 1e9, 1)})


def _update_machine(out: Path, **fields) -> None:
    path = out / MACHINE_FILE
    write_record(path, {**(read_record(path) or {}), **fields})


@dataclass
class Job:
    """One stage run of run_all: its command's extra arguments, where its record (and beside it, its log) go."""

    stage: str
    record: Path
    extra: list[str] = field(default_factory=list)  # after the stage's common arguments
    seed: int | None = None  # a run to a loss with another seed than the profile's

    def config(self, profile: str, device: str):
        """The stage's settings in this job (a TrainConfig), as its process builds them."""
        return stage_config(
            self.stage, profile, self.to_a_loss, device=device, seed=self.seed, speedrun_task=self.speedrun_task
        )

    @property
    def log(self) -> Path:
        return self.record.with_suffix(".log")

    @property
    def to_a_loss(self) -> bool:
        return "--time-to-loss" in self.extra

    @property
    def speedrun_task(self) -> bool:
        return "--speedrun-task" in self.extra

    @property
    def name(self) -> str:
        return self.stage + (f" seed {self.seed}" if self.seed is not None else "")


def ladder_jobs(stages: list[str], out: Path, extra=lambda stage: []) -> list[Job]:
    return [Job(stage, record_path(out, stage), extra(stage)) for stage in stages]


def loss_jobs(
    stages: list[str], folder: Path, seeds=(None,), target: float | None = None, speedrun_task: bool = False
) -> list[Job]:
    """The jobs of `stages` trained to a loss, each with each of `seeds`, their records and logs in `folder`.

    speedrun_task: on the speedrun's task (speed_0's seeds that set its target), not the time-to-loss settings. The
    folder is made when a job runs (run_stages): a quick run's dry run plans these jobs and writes nothing."""
    return [
        Job(
            stage,
            record_path(folder, stage, seed),
            ["--time-to-loss"]
            + (["--speedrun-task"] if speedrun_task else [])
            + (["--seed", str(seed)] if seed is not None else [])
            + (["--target-loss", repr(target)] if target is not None else []),
            seed,
        )
        for stage in stages
        for seed in seeds
    ]


def failed_record(job: Job, profile: str, device: str, reason: str, status: str = "failed") -> dict:
    """The record of a stage that ended without writing one, or that a quick run had no time left for.

    A stage ends without one when killed, interrupted or its interpreter crashed; one that a quick run had no time left
    for gets status "skipped"."""
    try:
        cfg = job.config(profile, device)
    except UserError:
        cfg = None
    record = unfinished_record(job.stage, profile, status, reason, cfg)
    if job.to_a_loss:
        record.update(mode="time_to_loss", seed=cfg.seed if cfg else job.seed)
    return record


def outcome(record: dict) -> str:
    """One line about a finished stage for the progress display."""
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('reason', '')}"
    m = record["metrics"]
    if record.get("mode") == TIME_TO_LOSS:
        target = m.get("target")
        return (
            f"ok  val loss {m['val_loss_initial']:.3f} -> {m['val_loss_final']:.3f} in {m['tokens']:,} tokens, "
            f"{fmt_num(m['train_seconds'])} s, {m['tokens_per_s']:,.0f} tokens/s"
            + (
                ""
                if m.get("target_loss") is None
                else f", target reached at {fmt_num(target['seconds'])} s"
                if target
                else ", target not reached"
            )
            + (" (stopped there)" if m.get("stopped_at_target") else "")
        )
    return (
        f"ok  {fmt_num(m['seconds_mean'])} s / {m['samples_per_repeat']:,} samples, "
        f"{m['tokens_per_s']:,.0f} tokens/s, peak {fmt_mib(m['peak_memory_mib'])} MiB"
    )


def run_stages(jobs: list[Job], args, profile: str, device: str, out: Path, progress: Progress) -> tuple[int, bool]:
    """Run the jobs in order with a progress line each; returns (failed stages, interrupted).

    In a quick run a job the time limit leaves no room for is recorded as not run, and one running when it comes is
    stopped."""
    deadline = args.deadline
    tty = sys.stdout.isatty()
    cr = "\r" if tty else ""  # on a terminal the final line overwrites the ticking one
    start, failures = progress.start, 0
    for job in jobs:
        stage, path, log = job.stage, job.record, job.log
        prefix = progress.prefix(job.name)
        if args.resume and not needs_run(read_record(path), profile, device, job):
            print(f"{prefix} kept: {outcome(read_record(path))}")
            continue

        def show(seconds, prefix=prefix):
            if tty:  # one line per stage, its clock ticking
                print(
                    f"\r{prefix} running {clock(seconds)}  (total {clock(time.monotonic() - start)})",
                    end="",
                    flush=True,
                )

        writable_dir(path.parent)
        if reason := not_run_reason(args, path):
            record = failed_record(job, profile, device, reason, "skipped")
            write_record(path, record)
            print(f"{prefix} {outcome(record)}")
            continue
        print(prefix, end="" if tty else " running\n", flush=True)
        before = path.stat().st_mtime_ns if path.exists() else None
        t0, rc, interrupted, stopped = time.monotonic(), None, False, False
        try:
            cmd = (
                stage_command(stage, profile, device, args.wandb, out)
                + ["--no-profiler"] * args.no_profiler
                + job.extra
            )
            rc = run_stage(cmd, log, show, deadline)
        except KeyboardInterrupt:
            interrupted = True
        except TimeLimitReached:
            stopped = True
        record = read_record(path) if path.exists() and path.stat().st_mtime_ns != before else None
        # no record of its own (or one from a crash the interruption caused): write one, so that no
        # stale record passes for this run's result
        if record is None or ((interrupted or stopped) and record.get("status") == "failed"):
            if stopped:
                reason = quick_run.STOPPED.format(limit=deadline.label)
            elif interrupted:
                reason = "interrupted (Ctrl-C or SIGTERM) before it finished"
            elif rc < 0:
                reason = f"killed by {signal.Signals(-rc).name}"
            else:
                reason = f"exit code {rc} without a record: {last_line(log)}"
            record = failed_record(job, profile, device, reason)
            write_record(path, record)
        wall_s = time.monotonic() - t0
        quick_run.mark(path, wall_s, deadline is not None)
        if args.plan and (item := args.plan.item_of(path)):
            item.wall_s = wall_s
        failures += record.get("status") == "failed"
        print(
            f"{cr}{prefix} {outcome(record)}  ({clock(time.monotonic() - t0)}, "
            f"total {clock(time.monotonic() - start)})" + ("" if record["status"] == "ok" else f"  log: {log}")
        )
        if interrupted:
            return failures, True
    return failures, False


def not_run_reason(args, record: Path) -> str | None:
    """Why a quick run does not run a stage: no room in its plan or in the time left, or its limit came; None: it runs.

    A stage the plan left out runs after all where the stages before it took less than planned (Plan.fits_now)."""
    deadline, plan = args.deadline, args.plan
    if plan and (item := plan.dropped_item(record)):
        if not plan.fits_now(item, deadline.left()):
            return quick_run.NOT_PLANNED.format(limit=deadline.label, command=item.command)
        item.reflowed = True
        print(f"   time left: running {item.name}, which the plan left out", flush=True)
    if deadline and deadline.passed():
        return quick_run.NOT_RUN.format(limit=deadline.label)
    return None


def planner_commands(out: Path, reuse_from: Path | None) -> dict[str, list[str]]:
    """The memory planner's reports by name, each one's `python -m gpt.memory` arguments but its --json.

    With --reuse of `reuse_from`'s record, where it has one, for those that do not depend on the machine
    (gpt/record_reuse.py)."""
    commands = {
        "compare": ["compare", "--runs", str(out)],
        "reference": ["reference"],
        "fit": ["fit", "--budget-gib", "80"],
    }
    for name in MACHINE_INDEPENDENT:
        if reuse_from and (source := reuse_from / report_file(name)).is_file():  # a GPU's kind commits none
            commands[name] += ["--reuse", str(source)]
    return commands


def planner_command(argv: list[str], record: Path, python: str = sys.executable) -> list[str]:
    """The command that runs one planner report with `argv` and writes its JSON to `record`."""
    return [python, "-m", "gpt.memory", *argv, "--json", str(record)]


def run_memory_planner(out: Path, reuse_from: Path | None, args=None) -> None:
    """The GPU memory planner's three reports (gpt/memory), run after the ladders.

    After them so they never share the CPU with a timed stage. The reports: estimates vs this run's measured peaks, vs
    the documented H100 peaks, and the largest model that fits 80 GiB. Their JSON files become the report's "Memory
    planner" section. The last two do not depend on the machine: `reuse_from`'s are reused while their code is
    unchanged (gpt/record_reuse.py). A quick run (`args`) runs them one at a time, as its plan has them."""
    commands = planner_commands(out, reuse_from)
    if args is not None and args.plan:
        return run_planner_in_turn(commands, out, args)
    running = {}  # side by side: each is one busy Python thread, and no timing is left to disturb
    for name, argv in commands.items():
        log = (out / report_file(name)).with_suffix(".log")
        print(f"[planner] python -m gpt.memory {' '.join(argv)}  (log: {log})", flush=True)
        with open(log, "w") as f:
            running[name] = (
                subprocess.Popen(planner_command(argv, out / report_file(name)), stdout=f, stderr=subprocess.STDOUT),
                log,
            )
    for name, (proc, log) in running.items():
        if (rc := proc.wait()) != 0:
            print(f"[planner] {name} failed (exit {rc}); see {log}")


def run_planner_in_turn(commands: dict[str, list[str]], out: Path, args) -> None:
    """A quick run's planner reports in turn: each its plan has room for (or its time left), stopped at its limit.

    One left out is not in the run's folder, so that the page shows no earlier run's report as this one's."""
    for name, argv in commands.items():
        record = out / report_file(name)
        if reason := not_run_reason(args, record):
            record.unlink(missing_ok=True)
            print(f"[planner] {name}: {reason}", flush=True)
            continue
        log = record.with_suffix(".log")
        print(f"[planner] python -m gpt.memory {' '.join(argv)}  (log: {log})", flush=True)
        t0 = time.monotonic()
        try:
            rc = run_stage(planner_command(argv, record), log, lambda s: None, args.deadline)
        except TimeLimitReached:
            print(f"[planner] {name}: {quick_run.STOPPED.format(limit=args.deadline.label)}", flush=True)
            continue
        args.plan.item_of(record).wall_s = time.monotonic() - t0
        if rc != 0:
            print(f"[planner] {name} failed (exit {rc}); see {log}")


def planner_items(args, figures: quick_run.Figures, out: Path, reuse_from: Path | None) -> list[quick_run.Item]:
    """A quick plan's memory-planner reports, after the memory ladder: each reused, or computed in its recorded time."""
    from gpt.memory.__main__ import reusable  # the planner's own arguments decide whether it will reuse a record

    items = []
    for name, argv in planner_commands(out, reuse_from).items():
        record = out / report_file(name)
        source = Path(argv[argv.index("--reuse") + 1]) if "--reuse" in argv else None
        reused = source if source and reusable(argv, source) else None
        bound = report_file("reference") if name == "compare" else None
        seconds, why = figures.planner(report_file(name), reused, name in MACHINE_INDEPENDENT, bound)
        command = shlex.join(planner_command(argv, record, python="python"))
        items.append(quick_run.Item(quick_run.PLANNER, name, seconds, why, command, record))
    return items


def run_to_a_loss(args, profile: str, device: str, out: Path, progress: Progress) -> tuple[int, bool]:
    """The fifth section, the speed and fast stages trained to a loss; returns (failed stages, interrupted).

    First speed_0 with BASELINE_SEEDS seeds (their spread is the run-to-run spread of the final validation loss), the
    target from its curve (loss_curve.target_from), then every other stage of the speed and fast ladders trained to
    the same budget with that target."""
    baseline, *rest = stages_of(*ladder_names("also"))
    failures, interrupted = run_stages(
        loss_jobs([baseline], time_to_loss_dir(out), baseline_seeds(profile)), args, profile, device, out, progress
    )
    if interrupted:
        return failures, True
    record = read_record(record_path(time_to_loss_dir(out), baseline))
    target = target_from(record) if record and record.get("status") == "ok" else None
    print(
        f"   target: {'none (the baseline did not finish)' if target is None else f'validation loss {target:.4f}'}"
        f", {TARGET_AT:.0%} of the way through {baseline}'s budget",
        flush=True,
    )
    jobs = loss_jobs(rest, time_to_loss_dir(out), target=target)
    more, interrupted = run_stages(jobs, args, profile, device, out, progress)
    return failures + more, interrupted


def baseline_seeds(profile: str) -> list[int | None]:
    """speed_0's seeds: the profile's (None: its record has no seed in its name) and the next ones."""
    first = stage_config(stages_of("speed")[0], profile, True).seed
    return [None] + [first + i for i in range(1, BASELINE_SEEDS)]


def run_speedrun(
    args, profile: str, device: str, out: Path, progress: Progress, baseline_ran: bool
) -> tuple[int, bool]:
    """The speedrun section, its stages trained to the baseline's model; returns (failed stages, interrupted).

    First speed_0's seeds on the speedrun's task (unless the time-to-loss section just trained them on it: the cpu
    profile's), the target (the highest final validation loss among them: the baseline's model), the gradient noise
    scale along speed_0's run (the report's plot), then every speedrun stage with that target: the last one with every
    seed, the others with the profile's. A quick run trains one seed of each and measures no noise scale."""
    baseline, failures = stages_of("speed")[0], 0
    seeds = [None] if args.quick else baseline_seeds(profile)
    folder = speedrun_baseline_dir(out, profile)
    if not (baseline_ran and speedrun_task_is_time_to_loss(profile)):
        jobs = loss_jobs([baseline], folder, seeds, speedrun_task=True)
        failures, interrupted = run_stages(jobs, args, profile, device, out, progress)
        if interrupted:
            return failures, True
    target = baseline_model_loss([read_record(record_path(folder, baseline, s)) for s in seeds])
    print(
        f"   speedrun target: {'none (a baseline seed did not finish)' if target is None else f'{target:.4f}'}, "
        f"{baseline}'s model (the highest final validation loss of its {len(seeds)} seed(s))",
        flush=True,
    )
    deadline = args.deadline
    if target is None and not (deadline and deadline.passed()):  # a quick run's limit: each stage says "not run"
        return failures, False
    if args.quick:
        print("[speedrun] no noise-scale measurement in a quick run (python -m gpt.noise_scale measures it)")
    else:
        run_noise_scale(
            profile,
            device,
            writable_dir(time_to_loss_dir(out, SPEEDRUN)),
            None if args.fresh else time_to_loss_dir(published_dir(profile, device), SPEEDRUN),
        )
        floor_record = time_to_loss_dir(out, SPEEDRUN) / ngram_floor.RECORD_FILE  # a count, no timing: seconds
        print(f"[speedrun] the n-gram floor (gpt/ngram_floor.py): {floor_record}", flush=True)
        write_record(floor_record, ngram_floor.measure(profile, target))
    *stages, last = stages_of(SPEEDRUN)
    first = stage_config(last, profile).seed
    last_seeds = [None] + ([] if args.quick else [first + i for i in range(1, SPEEDRUN_SEEDS)])
    folder = time_to_loss_dir(out, SPEEDRUN)
    jobs = loss_jobs(stages, folder, target=target) + loss_jobs([last], folder, last_seeds, target)
    forget_other_seeds(folder, jobs)
    more, interrupted = run_stages(jobs, args, profile, device, out, progress)
    return failures + more, interrupted


def forget_other_seeds(folder: Path, jobs: list[Job]) -> None:
    """Remove the records of other seeds of the jobs' stages in `folder` that no job writes: an earlier run's.

    The speedrun trains its last stage on more seeds; once a stage is added, the former last stage's extra seeds would
    otherwise stay in the run's folder beside its one new seed, and be published and reported with this run's. Other
    stages' records (speed_0's seeds, which the reference profile trains in that folder too) are left as they are."""
    written, stages = {job.record for job in jobs}, {job.stage for job in jobs}
    for stale in folder.glob("*.seed*.json"):
        if stale.name.split(".seed")[0] in stages and stale not in written:
            stale.unlink()


def run_noise_scale(profile: str, device: str, folder: Path, reuse_from: Path | None) -> None:
    """The gradient noise scale along speed_0's run (gpt/noise_scale.py): the measurement behind speedrun_2's batch.

    It also gives the report's plot of it. Its curve does not depend on the machine: `reuse_from`'s is reused while
    its code is unchanged (gpt/record_reuse.py); the step times t(B) are always this machine's."""
    log = folder / "noise_scale.log"
    source = reuse_from / NOISE_SCALE_FILE if reuse_from else None
    reuse = ["--reuse", str(source)] if source and source.is_file() else []
    print(f"[speedrun] python -m gpt.noise_scale {' '.join(reuse)}  (log: {log})", flush=True)
    with open(log, "w") as f:
        rc = subprocess.call(
            [
                sys.executable,
                "-m",
                "gpt.noise_scale",
                "--profile",
                profile,
                "--device",
                device,
                "--out",
                str(folder / NOISE_SCALE_FILE),
                *reuse,
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO_ROOT,
        )
    if rc:
        print(f"[speedrun] the noise-scale measurement failed (exit {rc}); see {log}")


def loss_stages(sections: list[str]) -> list[str]:
    """The stages the sections train to a loss, each once."""
    stages = stages_of(*ladder_names("also")) if TIME_TO_LOSS in sections else []
    if SPEEDRUN in sections:
        stages += [s for s in [stages_of("speed")[0], *stages_of(SPEEDRUN)] if s not in stages]
    return stages


def loss_job_count(sections: list[str], quick: bool = False, shared_baseline: bool = True) -> int:
    """The runs to a loss the sections make.

    shared_baseline: the time-to-loss section's speed_0 seeds set the speedrun's target too (the profile's time-to-loss
    settings are the speedrun's task: settings_profiles.speedrun_task_is_time_to_loss)."""
    baseline_seeds, last_seeds = (1, 1) if quick else (BASELINE_SEEDS, SPEEDRUN_SEEDS)
    count = len(stages_of(*ladder_names("also"))) + baseline_seeds - 1 if TIME_TO_LOSS in sections else 0
    if SPEEDRUN in sections:
        shared = TIME_TO_LOSS in sections and shared_baseline
        count += len(stages_of(SPEEDRUN)) + last_seeds - 1 + (0 if shared else baseline_seeds)
    return count


def finished_whole(args, interrupted: bool) -> bool:
    """Whether this run is a whole default run that finished: the only kind that replaces the committed report."""
    return not (interrupted or args.only or args.quick)


@exit_on_user_error
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = "cuda" if args.gpu else device_type(args.device)
    if not args.gpu:
        resolve_device(device)  # --device cuda without a GPU: one line now, not a dozen failed stages
    profile = args.profile or default_profile(device)
    out = (args.out or REPO_ROOT / "runs" / (f"{profile}-{device}" + "-quick" * args.quick)).resolve()
    if args.dry_run:  # nothing prepared, run or written: the plan only
        quick_plan(args, profile, device, out)
        return 0
    with lock_output(writable_dir(out)):  # released however the run ends, so a test's next run can take it
        return run(args, device, profile, out)


def run_sections_of(args) -> list[str]:
    return [args.only] if args.only else QUICK_SECTIONS if args.quick else SECTIONS


def timed_jobs(args, profile: str, out: Path) -> list[Job]:
    """The stage runs of the timed ladders the run's sections name, in order; fewer repeats in a quick run."""
    ladders = [s for s in run_sections_of(args) if s in timed_ladders()]
    extra = (
        (lambda stage: quick_run.stage_arguments(profile_settings(profile, base_ladder(ladder_of(stage)))))
        if args.quick
        else (lambda stage: [])
    )
    return ladder_jobs(stages_of(*ladders), out, extra)


def run(args, device: str, profile: str, out: Path) -> int:
    """The run main() holds the lock for: the sections asked for, in order, then the planner and the report."""
    started = time.perf_counter()
    sections = run_sections_of(args)
    ladders = [s for s in sections if s in timed_ladders()]
    jobs = timed_jobs(args, profile, out)
    progress = Progress(len(jobs) + loss_job_count(sections, args.quick, speedrun_task_is_time_to_loss(profile)))
    args.deadline = (
        quick_run.Deadline.starting_now(args.time_limit or quick_run.DEFAULT_LIMIT_MIN[device]) if args.quick else None
    )
    args.plan = None
    os.environ.setdefault("GPT_LADDER_GROUP", f"{profile}-{device}-{datetime.now():%Y%m%d-%H%M%S}")

    print(
        f"== GPT ladder: {' and '.join(s.replace('_', ' ') for s in sections)}, profile {profile} on {device} "
        f"({device_name(torch.device(device))}); records and logs in {out}"
    )
    prepare_data(profile, sections)
    write_machine(out, profile, device)
    say_what_cannot_run(
        jobs + [Job(stage, out, ["--time-to-loss"]) for stage in loss_stages(sections)], profile, device
    )
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load > 0.5 * cores:  # measured: one busy core slows a 2-thread CPU stage down by 30x and more
        print(
            f"warning: this machine is busy (load average {load:.1f} on {cores} cores); timings will "
            "suffer, memory figures will not"
        )
    rounds = 1 if profile == "smoke" or args.quick else 4  # smoke: the tests' profile, seconds per stage
    if args.quick:
        args.plan = quick_plan(args, profile, device, out)
    if device == "cpu":
        measure_cpu_peaks(out, rounds)
    for name in (ATTENTION_CACHE, LOSS_CACHE):  # measured afresh, once a run, by the first stage that needs each
        machine_cache.forget(name)
    if args.plan and args.plan.runs(quick_run.GPU_TESTS):
        args.plan.item_of(None).wall_s = quick_run.run_gpu_tests(out, args.deadline)["seconds"]
    failures, interrupted = run_sections(args, jobs, sections, profile, device, out, progress)
    if interrupted:
        print("interrupted: finished stages are recorded; `./run_all.sh --resume` runs the rest")

    if device == "cpu" and not interrupted:
        remeasure_cpu_peak(out, rounds)
    if "memory" in ladders and not interrupted:
        run_memory_planner(out, planner_reuse_from(args, profile, device), args)

    # the run's wall clock, data and planner included, for the README's run time (gpt/report/readme.py: run_time)
    wall_s = round(time.perf_counter() - started, 1)
    _update_machine(out, finished=datetime.now(UTC).isoformat(timespec="seconds"), wall_s=wall_s)
    write_results(args, out, profile, device, interrupted)
    if args.quick:
        print(f"   its plan and wall clocks: {quick_run.write_summary(out, args.deadline, args.plan, args.resume)}")
    return 130 if interrupted else 1 if failures else 0


def quick_plan(args, profile: str, device: str, out: Path) -> quick_run.Plan:
    """A quick run's plan, printed: its GPU tests and stage runs in order, each with its expected seconds.

    On a GPU the committed records of its kind (--gpu: the one named), newest first, then the other kinds'; elsewhere
    those of its profile and device. The GPU tests come only in a run of every quick section. With --resume the stage
    runs it keeps cost nothing."""
    kind = args.gpu or (quick_run.gpu_kind(torch.cuda.get_device_name()) if device == "cuda" else None)
    committed, others = quick_run.committed_folders(profile, device, kind)
    figures = quick_run.Figures(out, committed, profile, device, others, planned_gpus=1 if args.gpu else None)
    items = []
    if device == "cuda" and not args.only:
        command = quick_run.gpu_tests_command()
        name, command = shlex.join(["pytest", *command[3:]]), shlex.join(command)  # [python, -m, pytest, ...]
        items.append(quick_run.Item(quick_run.GPU_TESTS, name, *figures.gpu_tests(), command))
    for section, job in planned_jobs(args, profile, out):
        if args.resume and not needs_run(read_record(job.record), profile, device, job):
            continue
        rel, command = job.record.relative_to(out), rerun_command(args, section)
        seconds, why, warmed = figures.seconds(job.stage, rel, job.to_a_loss)
        cannot_run = figures.cannot_run(job.stage, rel, job.to_a_loss)
        items.append(quick_run.Item(section, job.name, seconds, why, command, job.record, cannot_run, warmed=warmed))
    if "memory" in run_sections_of(args):
        items += planner_items(args, figures, out, planner_reuse_from(args, profile, device))
    limit_min = args.time_limit or quick_run.DEFAULT_LIMIT_MIN[device]
    # a GPU planned from elsewhere (--gpu) is planned as a lent one starts: with nothing compiled
    cold_cache = bool(args.gpu) or quick_run.compile_cache_is_empty()
    plan = quick_run.Plan(items, 60 * limit_min * (1 - quick_run.REPORT_RESERVE), cold_cache)
    folders = ", ".join(f"records/{folder.name}" for folder in committed) or "none"
    source = f"{kind or device}'s records ({folders})" + (", then other GPUs'" if others else "")
    source += ", for a machine whose compile cache is empty" if cold_cache else ""
    quick_run.print_plan(plan, quick_run.minutes(60 * limit_min), source)
    return plan


def planner_reuse_from(args, profile: str, device: str) -> Path | None:
    """The committed folder whose planner reports a run reuses where still valid: its own kind's; none with --fresh."""
    return None if args.fresh else published_dir(profile, device)


def planned_jobs(args, profile: str, out: Path) -> list[tuple[str, Job]]:
    """A quick run's stage runs, section by section in the order they run (as run_sections makes them)."""
    sections, baseline = run_sections_of(args), stages_of("speed")[0]
    jobs = timed_jobs(args, profile, out)
    planned = []
    for section in sections:
        if section == TIME_TO_LOSS:
            rest = stages_of(*ladder_names("also"))[1:]
            folder = time_to_loss_dir(out)
            section_jobs = loss_jobs([baseline], folder, baseline_seeds(profile)) + loss_jobs(rest, folder)
        elif section == SPEEDRUN:  # as run_speedrun makes them, one seed each
            shared = TIME_TO_LOSS in sections and speedrun_task_is_time_to_loss(profile)
            first = [] if shared else loss_jobs([baseline], speedrun_baseline_dir(out, profile), speedrun_task=True)
            section_jobs = first + loss_jobs(stages_of(SPEEDRUN), time_to_loss_dir(out, SPEEDRUN))
        else:
            section_jobs = [job for job in jobs if ladder_of(job.stage) == section]
        planned += [(section, job) for job in section_jobs]
    return planned


def rerun_command(args, section: str) -> str:
    """The command that runs one section of a quick run alone, into the same folder, keeping what finished there."""
    given = [
        *(["--profile", args.profile] if args.profile else []),
        *(["--device", args.device] if args.device != "auto" else []),
        *(["--out", str(args.out)] if args.out else []),
        *(["--wandb", args.wandb] if args.wandb != "offline" else []),
    ]
    return shlex.join(["./run_all.sh", "--quick", "--only", section, *given, "--resume"])


def run_sections(args, jobs, sections, profile, device, out, progress) -> tuple[int, bool]:
    """Each section of `sections` in its order: a timed ladder's stages, the training to a loss, or the speedrun.

    A kill stops them as Ctrl-C does. Returns (failed stages, interrupted)."""
    on_term = signal.signal(signal.SIGTERM, signal.default_int_handler)
    failures, interrupted = 0, False
    try:
        for section in sections:
            if section == TIME_TO_LOSS:
                more, interrupted = run_to_a_loss(args, profile, device, out, progress)
            elif section == SPEEDRUN:
                more, interrupted = run_speedrun(args, profile, device, out, progress, TIME_TO_LOSS in sections)
            else:
                ladder = [job for job in jobs if ladder_of(job.stage) == section]
                more, interrupted = run_stages(ladder, args, profile, device, out, progress)
            failures += more
            if interrupted:
                break
    except KeyboardInterrupt:  # between two stages
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, on_term)
    return failures, interrupted


def write_results(args, out: Path, profile: str, device: str, interrupted: bool) -> None:
    """The report: beside the run's records, or for a whole default run that finished, the committed one.

    A whole default run that finished is the project's: its JSON records go to records/<profile>-<device>/
    (committed), and results.md and plots/ at the top of the repo are generated from there. A run with --out, a quick
    run, one section (--only) and an interrupted run keep their report beside their records, and leave the committed
    ones, results.md and plots/ as they were."""
    if args.out or not finished_whole(args, interrupted):
        results = write_report(out)
        if not args.out:
            print(
                "   the committed records, results.md and plots/ are unchanged: only a whole default run replaces "
                "them" + (" (`./run_all.sh --resume` completes this one)" if interrupted and not args.only else "")
            )
    else:
        results = write_report(publish(out, published_dir(profile, device)), REPO_ROOT / "results.md")
        if published_dir(profile, device) == README_RECORDS:  # the run the README quotes
            print(f"   rewrote the generated blocks of {rewrite_readme()}")
    print(f"== report: {results} (plots in {results.parent / 'plots'})")
    if args.wandb == "offline":
        wandb_dir = Path(os.environ.get("WANDB_DIR") or REPO_ROOT) / "wandb"
        print(
            f"   W&B (offline, group {os.environ['GPT_LADDER_GROUP']}): "
            f"upload with `wandb sync {wandb_dir}/offline-run-*`"
        )


if __name__ == "__main__":
    raise SystemExit(main())

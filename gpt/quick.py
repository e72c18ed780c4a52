"""The quick run (`./run_all.sh --quick`): a first look at the ladders on a user's own machine, within a time limit.

What it runs, in order: on a GPU the one-GPU tests (`pytest -m gpu`, at most a quarter of the limit), the speed and
fast ladders at QUICK_REPEATS timed repeats, then the speedrun (speed_0 on one seed, every speedrun stage on one seed,
no noise-scale measurement); with `--only memory` the memory ladder alone. Its records are real records, each marked
`run.quick`, kept in their own folder (runs/<profile>-<device>-quick by default) and never published over the
committed ones; `python -m gpt.report --runs <that folder>` makes their page. A stage that does not fit in the limit
is stopped, or not started, and its record says so; `--resume` completes the run.
"""

import importlib.util
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.records import read_record, write_record

QUICK_REPEATS = 2  # timed repeats per stage: two give a spread; the profiles' own are 3 to 5
QUICK_WARMUP = 5  # warm-up steps at most: compilation and CUDA-graph recording happen in the first three
# The limit when none is given, in minutes: on a GPU what issue 41 asks of one H100; on a CPU what the cpu profile's
# quick run took on the 2-core machines this project is built on, with a margin (docs/running.md has the figures).
DEFAULT_LIMIT_MIN = {"cuda": 9.0, "cpu": 20.0}
REPORT_RESERVE = 0.05  # of the limit, kept for the report after the last stage
GPU_TESTS_SHARE = 0.25  # of the limit, at most, for the GPU tests
NOT_RUN = "not run: the quick run's {limit} limit was reached first (--resume runs it)"
STOPPED = "stopped at the quick run's {limit} limit (--resume runs it again)"


def minutes(seconds: float) -> str:
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s} s" if m else f"{s} s"


@dataclass
class Deadline:
    """The quick run's limit: when it started, and how long it may last."""

    limit_s: float
    start: float

    @classmethod
    def starting_now(cls, limit_min: float) -> "Deadline":
        return cls(60 * limit_min, time.monotonic())

    @property
    def stages_end(self) -> float:
        """When the last stage must have ended: the report needs the rest."""
        return self.start + self.limit_s * (1 - REPORT_RESERVE)

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


def estimate(record_files: list[Path]) -> tuple[float, int]:
    """Seconds the stages of `record_files` took last time (their records' wall clocks), and how many had one."""
    walls = [r["run"]["wall_s"] for f in record_files if (r := read_record(f)) and r.get("run", {}).get("wall_s")]
    return sum(walls), len(walls)


def print_plan(
    sections: list[str],
    counts: dict[str, int],
    deadline: Deadline,
    gpu_tests: bool,
    earlier: tuple[float, int],
    total: int,
) -> None:
    """The plan and its estimate, before the first stage."""
    print(f"== quick run: a first look within {deadline.label} (--time-limit), every stage a real record marked quick")
    step = 1
    if gpu_tests:
        print(f"   {step}. the one-GPU tests: pytest -m gpu, at most {minutes(GPU_TESTS_SHARE * deadline.limit_s)}")
        step += 1
    for section in sections:
        what = {"speedrun": "speed_0 on one seed, then each speedrun stage to its final validation loss, one seed"}.get(
            section, f"{QUICK_REPEATS} timed repeats a stage"
        )
        print(f"   {step}. {section}: {counts[section]} stage runs, {what}")
        step += 1
    seconds, found = earlier
    print(
        f"   estimate: {minutes(seconds)} for {found} of the {total} stage runs, from the wall clocks of this "
        "folder's earlier records"
        if found
        else "   estimate: none yet (no earlier quick run in this folder); the limit bounds the run"
    )


def run_gpu_tests(out: Path, deadline: Deadline) -> dict:
    """`pytest -m gpu` (the one-GPU tests; the 2-GPU ones skip on one GPU), stopped at its share of the limit.

    Its closing line and exit code go to <out>/gpu_tests.json, its output to gpu_tests.log."""
    cap = min(GPU_TESTS_SHARE * deadline.limit_s, deadline.left())
    log = out / "gpu_tests.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "tests"]
    if importlib.util.find_spec("xdist"):  # pytest-xdist: the GPU tests side by side, as many as there are cores / 4
        cmd += ["-n", str(max(1, (os.cpu_count() or 4) // 4))]
    print(f"[gpu tests] {' '.join(cmd[1:])}  (at most {minutes(cap)}; log: {log})", flush=True)
    t0 = time.monotonic()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, timeout=cap
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
    summary = closing_line(log.read_text(errors="replace"))
    result = {
        "command": " ".join(cmd[1:]),
        "exit_code": rc,
        "seconds": round(time.monotonic() - t0, 1),
        "summary": summary if rc is not None else f"stopped at {minutes(cap)}; last line: {summary}",
    }
    write_record(out / "gpu_tests.json", result)
    print(f"[gpu tests] {result['summary']}", flush=True)
    return result


def closing_line(output: str) -> str:
    """pytest's closing line ('== 30 passed, 6 skipped in 101.97s =='), or the output's last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    closing = [line for line in lines if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    return (closing or lines or [""])[-1].strip("= ")

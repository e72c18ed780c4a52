"""A newcomer's first run of the README's try, timed: the last speedrun stage, empty caches (records/first_run.json).

    .venv/bin/python -m gpt.first_run      # runs the last speedrun stage's script as the README's try does

What it runs is the README's command (`try_command`), with XDG_CACHE_HOME and TORCHINDUCTOR_CACHE_DIR in an empty
temporary folder, so that nothing a run before it cached (the machine's measured choices, compiled graphs) is
reused. It keeps the process's wall clock, launch to exit (what `time` says), and the record's own split of it. The
README's try paragraph is generated from the entries of the newest's code (`code_of`; gpt/report/readme.py). Time it
on an idle machine.
"""

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from gpt.committed_records import PUBLISHED
from gpt.data import REPO_ROOT
from gpt.devices import cpu_kind
from gpt.ladder import stages_of
from gpt.records import append_run, read_record, time_to_loss_dir

RECORD = PUBLISHED / "first_run.json"
# What a stage's process runs: two first runs of the same files of these ran the same code, whatever else changed
CODE = ("gpt", "stages", "pyproject.toml")
# less the tools that launch stages, time them or read their records, which no stage's process imports (a test runs one)
NOT_RUN = ("gpt/report/", "gpt/first_run.py", "gpt/suite_time.py", "gpt/quick_run.py", "gpt/run_all.py")
LADDER = "speedrun"
TRY_OUT = "/tmp/try"  # the README's --out: the command as a user copies it
# The record's split of the process, in the order the summary prints it: (its key, its words)
SPLIT = (
    ("import_setup_s", "imports and arguments"),
    ("setup_s", "set-up"),
    ("startup_s", "start-up"),
    ("train_seconds", "training"),
    ("eval_seconds", "evaluations"),
)


def try_command(stage: str, out: str = TRY_OUT) -> list[str]:
    """The README's try: the stage's script, into `out`, without W&B."""
    return [".venv/bin/python", f"stages/{stage}.py", "--out", out, "--wandb", "disabled"]


def code_of(commit: str = "HEAD") -> str | None:
    """A short hash of the files of CODE less NOT_RUN at `commit`; None where HEAD's work tree has changes to them.

    Equal for two commits whose stages run the same code: a commit of tests, docs or the report between them changes
    none of those files."""
    git = ["git", "-C", str(REPO_ROOT)]
    if commit == "HEAD":
        excluded = [f":(exclude){path}" for path in NOT_RUN]
        if subprocess.check_output([*git, "status", "--porcelain", "--", *CODE, *excluded], text=True).strip():
            return None
    listing = subprocess.check_output([*git, "ls-tree", "-r", commit, "--", *CODE], text=True).splitlines()
    run = [line for line in listing if not line.split("\t", 1)[1].startswith(NOT_RUN)]
    return hashlib.sha1("\n".join(run).encode()).hexdigest()[:7]


def measure(stage: str) -> dict:
    """Run `stage` as the try does, with empty caches, and return the timing entry (its record's split with it)."""
    commit = subprocess.check_output(["git", "-C", str(REPO_ROOT), "rev-parse", "--short=7", "HEAD"], text=True)
    with tempfile.TemporaryDirectory(prefix="first-run-") as tmp:
        out, caches = Path(tmp) / "try", Path(tmp) / "caches"
        env = {**os.environ, "XDG_CACHE_HOME": str(caches), "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor")}
        cmd = [sys.executable, *try_command(stage, str(out))[1:]]
        print(f"[first run] {' '.join(try_command(stage))}, with empty caches (in {tmp})", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.run(cmd, cwd=REPO_ROOT, env=env).returncode
        wall_s = time.perf_counter() - t0
        record = read_record(time_to_loss_dir(out, LADDER) / f"{stage}.json") or {}
    metrics, choices = record.get("metrics", {}), record.get("choices", {})
    return {
        "stage": stage,
        "commit": commit.strip(),
        "code": code_of(),  # None: uncommitted changes, this run's code is no commit's
        "date": datetime.now(UTC).date().isoformat(),
        "cpu": cpu_kind(),
        "cores": os.cpu_count(),
        "command": " ".join(try_command(stage)) + " (empty XDG_CACHE_HOME and TORCHINDUCTOR_CACHE_DIR)",
        "exit_code": rc,
        "wall_s": round(wall_s, 1),
        "split": {key: round(metrics[key], 1) for key, _ in SPLIT if metrics.get(key) is not None},
        "tokens_to_target": round(t) if (t := (metrics.get("target") or {}).get("tokens")) else None,
        # the machine's measured choice: a first run measures it afresh, and its training's pace follows it
        "precision": choices.get("compute_dtype"),
        "precision_why": choices.get("amp_why"),
        "source": "measured by python -m gpt.first_run",
    }


def main(argv: list[str] | None = None) -> int:
    # no options: --help says what it runs, and anything else is refused before a minute of work is recorded
    argparse.ArgumentParser(prog="python -m gpt.first_run", description=__doc__.splitlines()[0]).parse_args(argv)
    stage = stages_of(LADDER)[-1]
    entry = measure(stage)
    append_run(RECORD, entry)
    print(f"[first run] {stage} at {entry['commit']}: {entry['wall_s']} s, launch to exit -> {RECORD}", flush=True)
    return 0 if entry["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

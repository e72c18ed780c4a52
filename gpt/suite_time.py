"""The test suite's wall clock from a fresh clone, as CI runs it, added to records/test_suite.json (the README's).

    .venv/bin/python -m gpt.suite_time      # clones this checkout's HEAD, runs its .ci/run, appends the record

A fresh clone pays what a newcomer's first `./setup.sh` pays on this machine (a virtual environment, the packages
from pip's cache or the network, the data) before pytest; both are kept, the whole and pytest's own seconds, with the
commit, the CPU and its cores. Time it on an idle machine: nothing else may run meanwhile.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from gpt.committed_records import PUBLISHED
from gpt.data import REPO_ROOT
from gpt.devices import cpu_kind
from gpt.formatting import fmt_minutes
from gpt.records import append_run, git_commit

RECORD = PUBLISHED / "test_suite.json"
# pytest's closing line: "== 783 passed, 50 skipped in 308.12s (0:05:08) ==" (failed, errors and the rest alike)
CLOSING = re.compile(r"=+ (?P<counts>[^=]*?) in (?P<seconds>[\d.]+)s\b")


def closing_counts(output: str) -> dict:
    """pytest's closing line read: {'passed': 783, 'skipped': 50, ..., 'pytest_s': 308.1}; {} where there is none."""
    found = CLOSING.findall(output)
    if not found:
        return {}
    counts, seconds = found[-1]
    tally = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", counts)}
    return {**tally, "pytest_s": round(float(seconds), 1)}


def measure(checkout: Path) -> dict:
    """Clone `checkout`'s HEAD into a temporary folder, run its .ci/run there, and return the timing record."""
    commit = subprocess.check_output(["git", "-C", str(checkout), "rev-parse", "HEAD"], text=True).strip()
    log_path = Path(tempfile.gettempdir()) / f"suite-time-{commit[:7]}.log"  # kept: the clone goes
    with tempfile.TemporaryDirectory(prefix="suite-time-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(checkout), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", commit], check=True)
        print(f"[suite time] {commit[:7]}: .ci/run in a fresh clone ({clone}); its output: {log_path}", flush=True)
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            ci = subprocess.run([str(clone / ".ci" / "run")], cwd=clone, stdout=log, stderr=subprocess.STDOUT)
        wall_s = time.perf_counter() - t0
    output = log_path.read_text(errors="replace")
    return {
        "commit": commit[:7],
        "date": datetime.now(UTC).date().isoformat(),
        "cpu": cpu_kind(),
        "cores": os.cpu_count(),
        "command": "time .ci/run (in a fresh clone)",
        "exit_code": ci.returncode,
        "wall_s": round(wall_s, 1),
        **closing_counts(output),
        "source": "measured by python -m gpt.suite_time",
    }


def summary(entry: dict) -> str:
    """One entry in words: its time in all and pytest's, the commit and date, the tally."""
    tally = ", ".join(f"{entry[k]} {k}" for k in ("passed", "failed", "skipped", "errors") if entry.get(k))
    pytest_s = f", {fmt_minutes(entry['pytest_s'])} of them pytest's" if entry.get("pytest_s") else ""
    facts = "; ".join(x for x in (entry["date"], tally) if x)
    return f"{fmt_minutes(entry['wall_s'])} in all{pytest_s}, at commit {entry['commit']} ({facts})"


def main(argv: list[str] | None = None) -> int:
    # no options: --help says what it times, and anything else is refused before a clone is made
    argparse.ArgumentParser(prog="python -m gpt.suite_time", description=__doc__.splitlines()[0]).parse_args(argv)
    if git_commit().endswith("-dirty"):
        print("[suite time] the clone takes HEAD: uncommitted changes here are not timed", flush=True)
    entry = measure(REPO_ROOT)
    append_run(RECORD, entry)
    print(f"[suite time] {entry['cpu']}, {entry['cores']} cores: {summary(entry)} -> {RECORD}", flush=True)
    return 0 if entry["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

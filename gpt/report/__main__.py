"""python -m gpt.report: results.md and its plots, regenerated from a run directory's JSON records.

    python -m gpt.report [--runs runs/cpu-cpu] [--out runs/cpu-cpu/results.md]

The report in rooms: rows.py (records -> rows), formatting.py, tables.py, findings.py, where_time_goes.py,
plots.py, and document.py, which puts them together; the memory planner's section is beside the planner
(gpt/memory/report_section.py).
"""
import argparse
from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.devices import device_type
from gpt.errors import UserError, exit_on_user_error
from gpt.profiles import default_profile
from gpt.report.document import write_report


def default_runs_dir() -> Path:
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

"""python -m gpt.report: results.md and its plots, regenerated from a run directory's JSON records.

    python -m gpt.report                                   # results.md and README.md's generated blocks from
                                                           # records/<default profile>-<device>
    python -m gpt.report --runs records/h100-2026-11-24    # that folder's results.md, plots/ beside it
    python -m gpt.report --runs runs/cpu-cpu --out /tmp/results.md

Each section of the page is a module of gpt/report/ (docs/design.md maps them).
"""

import argparse
from pathlib import Path

from gpt.committed_records import PUBLISHED, published_dir
from gpt.data import REPO_ROOT
from gpt.devices import device_type
from gpt.errors import UserError, exit_on_user_error
from gpt.report.document import write_report
from gpt.report.readme import rewrite_readme
from gpt.report.rows import display
from gpt.settings_profiles import default_profile


def default_runs_dir() -> Path:
    """The committed records of this machine's default run (gpt/committed_records.py)."""
    dev = device_type("auto")
    return published_dir(default_profile(dev), dev)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Regenerate results.md and its plots from a ladder's JSON records.")
    p.add_argument(
        "--runs",
        type=Path,
        help="records directory (default: records/<default profile>-<device>, the "
        "committed records of a default ./run_all.sh)",
    )
    p.add_argument(
        "--out",
        type=Path,
        help="the Markdown file to write (default: results.md at the top of the repo "
        "without --runs, else <runs>/results.md); plots go to plots/ beside it",
    )
    args = p.parse_args(argv)
    runs = args.runs or default_runs_dir()
    if not runs.is_dir():
        committed = ", ".join(sorted(p.name for p in PUBLISHED.glob("*/") if p.is_dir())) or "none"
        raise UserError(
            f"records directory {display(runs)} does not exist"
            + ("" if args.runs else f": run ./run_all.sh, or give --runs records/<one of: {committed}>")
        )
    out = args.out or (None if args.runs else REPO_ROOT / "results.md")
    print(f"wrote {write_report(runs, out)}")
    if not (args.runs or args.out):  # the committed pages: the README's figures too
        print(f"rewrote the generated blocks of {rewrite_readme()}")


if __name__ == "__main__":
    main()

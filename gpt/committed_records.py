"""The committed records: a run's JSON files copied into records/<profile>-<device>/ of the repo.

Committed so that results.md can be regenerated from a clone and another run set beside it. Traces, logs and allocator
snapshots (megabytes) stay in the run's own directory (runs/<profile>-<device>/ by default, not committed)."""

import shutil
from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.ladder import ladder_names
from gpt.records import time_to_loss_dir
from gpt.settings_profiles import SPEEDRUN, profile_settings

PUBLISHED = REPO_ROOT / "records"
NOTE = "note.md"  # a records folder's provenance (e.g. made by older code), shown under the report's header
# The default run whose committed speed_0 seeds set the speedrun's target: the task was tuned there
# (gpt/settings_profiles.py)
SPEEDRUN_TARGET_SET_BY = ("cpu", "cpu")


def published_dir(profile: str, device: str) -> Path:
    """Where a default run of this profile on this device commits its records."""
    return PUBLISHED / f"{profile}-{device}"


def committed_speedrun_target(profile: str, device: str) -> tuple[Path, str]:
    """The committed folder whose speed_0 seeds set the speedrun's target for `profile`, and its profile."""
    home = SPEEDRUN_TARGET_SET_BY[0]
    if profile_settings(profile, SPEEDRUN) == profile_settings(home, SPEEDRUN):
        return published_dir(*SPEEDRUN_TARGET_SET_BY), home
    return published_dir(profile, device), profile


def json_files(runs: Path) -> list[Path]:
    """A run's JSON files: the stage records, machine.json, the planner's reports, the runs to a loss."""
    return sorted(runs.glob("*.json")) + [
        f for ladder in (None, *ladder_names("only")) for f in sorted(time_to_loss_dir(runs, ladder).glob("*.json"))
    ]


def publish(runs: Path, dest: Path) -> Path:
    """Replace the JSON files in `dest` by the run's (so no record of an earlier run is left beside them)."""
    for old in json_files(dest):
        old.unlink()
    for f in json_files(runs):
        target = dest / f.relative_to(runs)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, target)
    return dest

"""The code's form: `ruff format` and `ruff check` with the rules chosen in pyproject.toml find nothing to change.

Skipped where ruff is not installed: `pip install -e ".[test]"` installs it."""

import shutil
import subprocess

import pytest
from conftest import REPO

RUFF = shutil.which("ruff") or shutil.which("ruff", path=str(REPO / ".venv" / "bin"))


@pytest.mark.skipif(RUFF is None, reason="ruff is not installed")
@pytest.mark.parametrize("command", [["format", "--check"], ["check"]])
def test_ruff_finds_nothing_to_change(command):
    r = subprocess.run([RUFF, *command, "."], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]

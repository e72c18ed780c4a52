#!/usr/bin/env bash
# Set up the project's virtual environment, .venv: what ./run_all.sh does first, and the README's test command.
#
# The venv sees the system's packages, so a PyTorch already installed there (2.11 or newer: a GPU image's CUDA
# build, 2.14 included) is used as it is. Only where there is none (or one older than 2.11) is torch==2.13.0
# installed first: on this project's CPU machines that is the CPU build the package index serves (on Linux
# elsewhere, PyPI's CUDA build), where an unpinned `torch>=2.11` would pull the newest release's CUDA wheels,
# gigabytes. Then `pip install -e ".[test]"` adds only what is missing: pyproject.toml asks for torch>=2.11,
# which the torch present satisfies, so pip keeps it. Reinstalled only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")"

# One set-up at a time: two runs started together would otherwise pip-install into .venv at once (seen failing).
if command -v flock >/dev/null; then
    exec 9>.setup.lock
    flock 9
fi

if [ ! -x .venv/bin/python ]; then
    echo "creating the virtual environment .venv"
    python3 -m venv --system-site-packages .venv
fi
if ! .venv/bin/python -c 'import sys, torch; sys.exit(tuple(map(int, torch.__version__.split(".")[:2])) < (2, 11))' \
        2>/dev/null; then
    echo "no PyTorch 2.11 or newer here: installing torch==2.13.0 into .venv"
    .venv/bin/pip install --quiet "torch==2.13.0"
fi
stamp=.venv/.installed-pyproject-sha256
wanted=$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    echo "installing the project and its dependencies into .venv (pip install -e \".[test]\")"
    .venv/bin/pip install --quiet -e ".[test]"
    echo "$wanted" > "$stamp"
fi

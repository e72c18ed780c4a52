#!/usr/bin/env bash
# The project's main job: set up the environment, run the four ladders on this machine, write the report.
#
#   ./run_all.sh                          # default profile for the hardware found (reference on CUDA, cpu otherwise)
#   ./run_all.sh --profile smoke --out /tmp/smoke_runs      # every stage on tiny shapes, a few minutes
#   ./run_all.sh --only memory --resume   # one ladder; keep the stages that already have a record
#
# Options (--profile, --only, --device, --wandb, --out, --resume, --no-profiler) go to gpt/run_all.py (`--help`).
# Results: <out>/results.md with plots in <out>/plots/; per stage <out>/<stage>.json and <stage>.log.
set -euo pipefail
cd "$(dirname "$0")"

# The project's virtual environment, (re)installed only when pyproject.toml changed since the last install.
# It sees the system's packages: a PyTorch already installed there (2.11 to 2.13.0, e.g. a GPU image's CUDA
# build) is used as it is, and pip adds only what is missing.
if [ ! -x .venv/bin/python ]; then
    echo "creating the virtual environment .venv"
    python3 -m venv --system-site-packages .venv
fi
stamp=.venv/.installed-pyproject-sha256
wanted=$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    echo "installing the project and its dependencies into .venv (pip install -e \".[test]\")"
    .venv/bin/pip install --quiet -e ".[test]"
    echo "$wanted" > "$stamp"
fi

# Everything else (data, stages, progress, interruption, report) is Python: gpt/run_all.py.
exec .venv/bin/python -m gpt.run_all "$@"

#!/usr/bin/env bash
# The project's main job: set up the environment, run the four ladders and the time to loss here, write the report.
#
#   ./run_all.sh                          # default profile for the hardware found (reference on CUDA, cpu otherwise)
#   ./run_all.sh --profile smoke --out /tmp/smoke_runs      # every stage on tiny shapes, a few minutes
#   ./run_all.sh --only memory --resume   # one ladder; keep the stages that already have a record
#
# Options (--profile, --only, --device, --wandb, --out, --resume, --no-profiler, --fresh) go to gpt/run_all.py (`--help`).
# Results: <out>/results.md with plots in <out>/plots/; per stage <out>/<stage>.json and <stage>.log.
set -euo pipefail
cd "$(dirname "$0")"

# The project's virtual environment (.venv), set up or brought up to date: setup.sh says how.
./setup.sh

# Everything else (data, stages, progress, interruption, report) is Python: gpt/run_all.py.
exec .venv/bin/python -m gpt.run_all "$@"

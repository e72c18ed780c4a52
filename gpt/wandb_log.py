"""Log a finished stage's record to Weights & Biases, after training: one W&B run per stage.

What is logged, and under which names: docs/running.md#comparing-runs-in-weights--biases. Nothing here runs inside the
timed loop: the curves are replayed from the record. A W&B problem never fails a stage: one warning line.
"""

import importlib.util
import os
import shutil
import sys
from datetime import date
from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.records import other_seed

PROJECT = "gpt-ladder"


def run_group(record: dict) -> str:
    """The ladder run's group; the speedrun's stages have a group of their own (<group>-speedrun)."""
    group = os.environ.get("GPT_LADDER_GROUP") or (
        f"{record['profile']}-{record.get('device', {}).get('type', 'unknown')}-{date.today().isoformat()}"
    )
    return group + ("-speedrun" if record.get("ladder") == "speedrun" else "")


def run_config(record: dict) -> dict:
    """Everything that defines the run, so W&B can filter and group stages by any setting."""
    keys = ("stage", "ladder", "profile", "parent", "mode", "model", "choices", "device")
    return {
        **record.get("config", {}),
        **{k: record[k] for k in keys if k in record},
        "git_commit": record.get("env", {}).get("git_commit"),
        "torch": record.get("env", {}).get("torch"),
    }


def summary(record: dict) -> dict:
    """The record's scalar figures, dicts flattened (memory_breakdown_mib/<part>, profiler/<fact>, ...)."""
    out = {"status": record["status"]}
    for key, value in record.get("metrics", {}).items():
        if isinstance(value, dict):
            out.update({f"{key}/{k}": v for k, v in value.items()})
        elif not isinstance(value, list) and value is not None:
            out[key] = value
    return out


def log_run(record: dict, mode: str, files: list[Path] = ()) -> None:
    """Log one stage (mode offline | online; disabled does nothing) with `files` (the trace) attached; never raises."""
    if mode == "disabled":
        return
    if not wandb_installed():
        print(
            f"warning: wandb is not installed, so {record.get('stage')} is not logged to W&B (pip install wandb, "
            "or --wandb disabled); the JSON record is unaffected",
            file=sys.stderr,
        )
        return
    try:
        _log(record, mode, files)
    except Exception as e:  # noqa: BLE001 - any W&B problem: warn once, the stage has succeeded
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(
            f"warning: W&B logging of {record.get('stage')} failed ({type(e).__name__}: {first}); "
            "the JSON record is unaffected",
            file=sys.stderr,
        )


def wandb_installed() -> bool:
    return importlib.util.find_spec("wandb") is not None


def _log(record: dict, mode: str, files: list[Path]) -> None:
    import wandb

    if mode == "online" and not wandb.login(prompt=False, verify=False):
        raise RuntimeError("not logged in to W&B: run `wandb login` first, or use --wandb offline")
    wandb_dir = Path(os.environ.get("WANDB_DIR") or REPO_ROOT)  # W&B writes into <dir>/wandb/
    wandb_dir.mkdir(parents=True, exist_ok=True)
    settings = wandb.Settings(
        silent=True,  # no banners in the stage's output
        console="off",  # the stage has already printed everything; do not capture stdout
        x_disable_stats=True,  # no system-metrics sampler: training is over, it would only add noise
        disable_git=True,  # the commit is in the config already
        save_code=False,
        init_timeout=60,  # online with an unreachable server: give up instead of waiting forever
    )
    to_a_loss = record.get("mode") == "time_to_loss"
    job = ("speedrun" if record.get("ladder") == "speedrun" else "time_to_loss") if to_a_loss else record["ladder"]
    run = wandb.init(
        project=PROJECT,
        group=run_group(record),
        job_type=job,
        name=run_name(record),
        config=run_config(record),
        mode=mode,
        dir=str(wandb_dir),
        settings=settings,
        reinit="finish_previous",
    )
    try:
        if to_a_loss:
            _log_curve(run, record)
        else:
            _log_steps(run, record)
        run.summary.update(summary(record))
        for path in files:  # a copy in the run's own directory: a rerun replacing the file cannot change it
            copy = Path(shutil.copy(path, run.dir))
            run.save(str(copy), base_path=run.dir, policy="now")
    finally:
        run.finish()
        wandb.teardown()  # waits until the run is on disk (finish() alone may return before that)


def run_name(record: dict) -> str:
    """The stage; a run to a loss with another seed than the profile's says which."""
    seed = other_seed(record.get("seed"), record["profile"])
    return record["stage"] + (f" (seed {seed})" if seed is not None else "")


def _log_curve(run, record: dict) -> None:
    """Log a run to a loss: train and validation loss at every evaluation, against tokens (the axis every stage shares).

    The step, the training seconds and the process's wall clock are logged beside, the same names in every stage."""
    run.define_metric("curve/tokens")
    optional = {  # None or absent (older records): unlogged
        "train/loss": "train_loss",
        "curve/lr": "lr",
        "curve/muon_lr": "muon_lr",
        "curve/wall_seconds": "wall_s",
    }
    for name in ("val/loss", "curve/step", "curve/seconds", *optional):
        run.define_metric(name, step_metric="curve/tokens")
    for point in record["metrics"]["curve"]:
        row = {
            "curve/tokens": point["tokens"],
            "curve/step": point["step"],
            "curve/seconds": point["seconds"],
            "val/loss": point["val_loss"],
        }
        row.update({name: point[key] for name, key in optional.items() if point.get(key) is not None})
        run.log(row)


def _log_steps(run, record: dict) -> None:
    """A timed run: each step's loss, time and throughput, and memory through the instrumented step."""
    m = record.get("metrics", {})
    # per optimizer step: loss, step time and throughput, on their own x-axis
    run.define_metric("train/step")
    run.define_metric("train/*", step_metric="train/step")
    cfg, count = record["config"], record.get("device", {}).get("count", 1)
    tokens_per_step = cfg["batch_size"] * cfg["block_size"] * count  # every process's batch
    for i, (loss, seconds) in enumerate(zip(m.get("losses", []), m.get("step_times_s", []))):
        run.log(
            {
                "train/step": i,
                "train/loss": loss,
                "train/step_time_s": seconds,
                "train/tokens_per_s": tokens_per_step / seconds,
            }
        )
    # memory through the instrumented step, on an x-axis of its own (allocation events)
    run.define_metric("memory/event")
    run.define_metric("memory/*", step_metric="memory/event")
    for i, mib in enumerate(m.get("memory_timeline_mib") or []):
        run.log({"memory/event": i, "memory/live_mib": mib})

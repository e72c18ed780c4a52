"""The arithmetic of a validation-loss curve: where it crosses a target, the targets, the seeds' spread.

Pure functions over the records' curves (gpt/time_to_loss.py writes them), with no imports from the project: the
report, run_all and the runner all stand on it.
"""


def crossing(curve: list[dict], target: float) -> dict | None:
    """Where the validation loss first reaches `target`, interpolated between two evaluations (None: never).

    The evaluation before the crossing may be an estimate on fewer windows: its loss is then its prediction of every
    window's (gpt/evaluation.py: near_target), never at or below the target."""
    for i, point in enumerate(curve):
        if point["val_loss"] > target:
            continue
        if i == 0:
            return {"tokens": 0, "seconds": 0.0, "first_evaluation_step": 0, "rule": "reached before training"}
        before = curve[i - 1]
        f = (before["val_loss"] - target) / (before["val_loss"] - point["val_loss"])
        return {
            "tokens": before["tokens"] + f * (point["tokens"] - before["tokens"]),
            "seconds": before["seconds"] + f * (point["seconds"] - before["seconds"]),
            "first_evaluation_step": point["step"],
            "rule": "interpolated between the evaluations before and at the crossing",
        }
    return None


def val_loss_at(curve: list[dict], tokens: float) -> float:
    """The validation loss at `tokens` tokens, interpolated linearly between the two evaluations around it."""
    if not curve[0]["tokens"] <= tokens <= curve[-1]["tokens"]:
        raise ValueError(f"{tokens} tokens is outside the curve ({curve[0]['tokens']} to {curve[-1]['tokens']})")
    for before, point in zip(curve, curve[1:]):
        if tokens <= point["tokens"]:
            f = (tokens - before["tokens"]) / (point["tokens"] - before["tokens"])
            return before["val_loss"] + f * (point["val_loss"] - before["val_loss"])
    return curve[-1]["val_loss"]


TARGET_AT = 0.8  # the target: the baseline's validation loss at this fraction of its budget
BASELINE_SEEDS = 3  # speed_0 is trained with this many seeds (the profile's and the next ones): their spread


def target_from(baseline: dict) -> float:
    """The target loss of a run's stages: speed_0's validation loss at TARGET_AT of its tokens (reached in time)."""
    curve = baseline["metrics"]["curve"]
    return val_loss_at(curve, TARGET_AT * curve[-1]["tokens"])


SPEEDRUN_SEEDS = 3  # the speedrun's last stage is trained with this many seeds: its claim holds only if every one does


def baseline_model_loss(baselines: list[dict | None]) -> float | None:
    """The speedrun's target, the baseline's model: the highest final validation loss among speed_0's seeds.

    The loss every seed reaches by the end of its budget (None unless every seed finished); not their mean
    (docs/speedrun.md#what-it-is)."""
    if not baselines or any(r is None or r.get("status") != "ok" for r in baselines):
        return None
    return max(r["metrics"]["val_loss_final"] for r in baselines)


def seed_spread(finals: list[float]) -> float:
    """The run-to-run spread of the final validation loss: the range over the baseline's seeds."""
    return max(finals) - min(finals) if len(finals) > 1 else 0.0


def changes_convergence(final: float, parent_final: float, spread: float) -> bool:
    """Whether a stage changes convergence: its final validation loss differs from its parent's by more than `spread`.

    `spread`: how much the baseline's seeds differ among themselves."""
    return abs(final - parent_final) > spread

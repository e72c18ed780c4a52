"""The keys a stage's record must have, and the check the tests hold every record they make against.

docs/records.md documents what each key means; only the tests ask whether a record has them all.
"""

RECORD_KEYS = {"stage", "ladder", "profile", "parent", "status", "config", "env"}
OK_KEYS = {"model", "device", "choices", "metrics"}
METRIC_KEYS = {
    "seconds_mean",
    "seconds_std",
    "seconds_per_repeat",
    "samples_per_repeat",
    "steps_per_repeat",
    "tokens_per_s",
    "step_time_s",
    "step_times_s",
    "first_step_s",
    "warmup_s",
    "compile_s",
    "data_wait_pct",
    "peak_memory_mib",
    "peak_memory_allocated_mib",
    "peak_memory_reserved_mib",
    "peak_memory_warmup_allocated_mib",
    "memory_breakdown_mib",
    "memory_timeline_mib",
    "memory_snapshot",
    "flops_per_token",
    "copy_pct",
    "time_breakdown_pct",
    "profiler",
    "peak_flops_per_device",
    "peak_flops_source",
    "mfu_pct",
    "peak_flops_fastest",
    "peak_flops_fastest_source",
    "mfu_fastest_pct",
    "loss_first",
    "loss_final",
    "losses",
}
# A stage trained to a loss (record["mode"] == "time_to_loss", gpt/time_to_loss.py) has these metrics instead.
LOSS_METRIC_KEYS = {
    "curve",
    "steps",
    "tokens",
    "train_seconds",
    "startup_s",
    "first_step_s",
    "compile_cache",
    "eval_seconds",
    "evaluations",
    "tokens_per_s",
    "val_loss_initial",
    "val_loss_final",
    "train_loss_final",
    "target_loss",
    "target",
    "stopped_at_target",
}
STATUSES = {"ok", "oom", "failed", "skipped"}


def record_problems(record: dict) -> list[str]:
    """What is missing or malformed in a record (an empty list for a valid one)."""
    problems = [f"missing key {k!r}" for k in sorted(RECORD_KEYS - set(record))]
    status = record.get("status")
    if status not in STATUSES:
        problems.append(f"status {status!r} is not one of {sorted(STATUSES)}")
    if status == "ok":
        problems += [f"missing key {k!r}" for k in sorted(OK_KEYS - set(record))]
        metrics = record.get("metrics", {})
        if record.get("mode") == "time_to_loss":
            return problems + [f"missing metric {k!r}" for k in sorted(LOSS_METRIC_KEYS - set(metrics))]
        problems += [f"missing metric {k!r}" for k in sorted(METRIC_KEYS - set(metrics))]
        if not metrics.get("seconds_mean", 0) > 0:
            problems.append("seconds_mean must be positive")
        shares = metrics.get("time_breakdown_pct")
        if shares is not None and (abs(sum(shares.values()) - 100) > 1e-6 or min(shares.values()) < 0):
            problems.append(f"time_breakdown_pct must be shares adding up to 100, got {shares}")
    elif not record.get("reason"):
        problems.append(f"a {status!r} record needs a reason")
    return problems

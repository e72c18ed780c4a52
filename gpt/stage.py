"""What `python stages/<stage>.py` runs: the shared command line, the run, its record (written whatever happens)."""

import argparse
import math
import os
import sys
import traceback
from pathlib import Path

from gpt import distributed, optimizations
from gpt.command_line import add_shared_options
from gpt.committed_records import committed_speedrun_target
from gpt.config import TrainConfig
from gpt.data import REPO_ROOT, load_prepared, prepare_if_missing
from gpt.devices import device_type, resolve_device
from gpt.errors import UserError, exit_on_user_error
from gpt.ladder import declaration, ladder_of, parent_of, settings_section, stage_config, trains_to_a_loss_only
from gpt.optimizations import chunked_loss, parallel
from gpt.records import (
    environment,
    failure_of,
    other_seed,
    peak_memory_pair,
    ran_eager,
    read_record,
    record_path,
    snapshot_path,
    speedrun_baseline_dir,
    speedrun_target,
    time_to_loss_dir,
    trace_path,
    writable_dir,
    write_record,
)
from gpt.settings_profiles import PROFILES, budget_settings, default_profile, profile_settings

EXIT_SKIPPED = 3  # a stage that cannot run on this machine (e.g. DDP with one GPU)


def parse_args(stage: str, argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=f"python stages/{stage}.py",
        description=declaration(stage).doc.strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--profile", help=f"settings profile: {', '.join(PROFILES)} (default: reference with CUDA, cpu without)"
    )
    add_shared_options(p)
    p.add_argument("--out", help="directory for the JSON record (default: runs/<profile>-<device>)")
    p.add_argument("--samples", type=int, help="N, samples per timed repeat (all ranks together)")
    p.add_argument("--repeats", type=int, help="timed repeats of N samples")
    p.add_argument("--warmup-iters", type=int, help="untimed warm-up optimizer steps")
    p.add_argument("--preset", help="model preset (gpt-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl)")
    p.add_argument("--n-layer", type=int, help="override the preset's number of layers")
    p.add_argument("--batch-size", type=int, help="samples per optimizer step and process")
    p.add_argument("--block-size", type=int, help="sequence length (at most the model's 1024 positions)")
    p.add_argument("--data-dir", help="prepared data directory (python data/prepare.py)")
    p.add_argument("--dropout", type=float, help="dropout probability (the profiles use the reference's 0.1)")
    p.add_argument(
        "--loss-impl",
        choices=["auto", *chunked_loss.IMPLEMENTATIONS],
        help="who computes the chunked loss (loss='chunked' stages): auto picks the first available "
        "of torch (PyTorch >= 2.12), liger (liger-kernel), cce (cut-cross-entropy), plain (plain PyTorch, everywhere)",
    )
    p.add_argument(
        "--no-profiler",
        action="store_true",
        help="skip the profiled steps after timing: no time breakdown, no <stage>.trace.json.gz",
    )
    loss = p.add_argument_group(
        "training to a loss (speed and fast stages: from scratch, on the profile's "
        "time-to-loss settings; record in <out>/time_to_loss/)"
    )
    loss.add_argument("--time-to-loss", action="store_true", help="train to the profile's token budget")
    loss.add_argument(
        "--train-tokens",
        type=int,
        help="train to this many tokens (implies --time-to-loss; the "
        "learning rate decays to its floor at the budget's end)",
    )
    loss.add_argument(
        "--eval-every-tokens",
        type=int,
        help="evaluate every this many tokens (default: the profile's, or a fortieth of --train-tokens)",
    )
    loss.add_argument(
        "--speedrun-task",
        action="store_true",
        help="train to a loss on the speedrun's task (gpt/settings_profiles.py: SPEEDRUN_TASK), not the profile's "
        "time-to-loss settings, as speed_0's seeds that set the speedrun's target do (their records: "
        "gpt/records.py:speedrun_baseline_dir)",
    )
    loss.add_argument("--target-loss", type=float, help="the validation loss whose crossing is timed")
    loss.add_argument(
        "--full-budget",
        action="store_true",
        help="train the whole budget even once the target is reached (a speedrun stage stops there); a speedrun "
        "stage with no target found trains it instead of stopping with an error",
    )
    loss.add_argument("--seed", type=int, help="another seed than the profile's (record <stage>.seed<N>.json)")
    loss.add_argument(
        "--lr",
        type=float,
        help="another peak learning rate than the profile's (its floor keeps the "
        "profile's ratio to it), e.g. to retune a stage that changes the batch",
    )
    return p.parse_args(argv)


def to_a_loss_overrides(args, profile: dict) -> dict:
    """The settings a run to a loss takes from the command line (None: the profile's); bad input is one line."""
    if args.train_tokens is not None and args.train_tokens <= 0:
        raise UserError(f"--train-tokens must be a positive number of tokens, got {args.train_tokens}")
    if args.eval_every_tokens is not None and args.eval_every_tokens <= 0:
        raise UserError(f"--eval-every-tokens must be at least 1, got {args.eval_every_tokens}")
    budget = args.train_tokens
    overrides = {
        "target_loss": args.target_loss,
        "seed": args.seed,
        "eval_every_tokens": args.eval_every_tokens,
        "stop_at_target": False if args.full_budget else None,
    }
    if budget:
        overrides.update(budget_settings(budget, profile["lr_warmup_tokens"]))
        overrides["eval_every_tokens"] = args.eval_every_tokens or overrides["eval_every_tokens"]
    if args.lr is not None:
        if not (math.isfinite(args.lr) and args.lr > 0):
            raise UserError(f"--lr must be a positive number, got {args.lr}")
        overrides.update(lr=args.lr, min_lr=args.lr * profile["min_lr"] / profile["lr"])
    return overrides


def default_speedrun_target(
    stage: str, out: Path, profile: str, device: str, full_budget: bool = False
) -> float | None:
    """The target of a speedrun stage run alone without --target-loss: speed_0's model, as run_all finds it.

    In the run's folder, else in the committed records (committed_records.committed_speedrun_target); one line says
    which. With none, a one-line error, or with --full-budget a line saying it trains its whole budget."""
    places = [(out, profile), committed_speedrun_target(profile, device)]
    for folder, folder_profile in places:
        target = speedrun_target(folder, folder_profile)
        if target is not None:
            print(
                f"{stage}: target {target:.4f}, speed_0_baseline's final validation loss in "
                f"{speedrun_baseline_dir(folder, folder_profile)} (--target-loss sets another)"
            )
            return target
    searched = " or ".join(str(speedrun_baseline_dir(folder, p)) for folder, p in places)
    if not full_budget:
        raise UserError(
            f"{stage}: no target: no speed_0_baseline record in {searched} (--target-loss sets one; --full-budget "
            "trains the budget without)"
        )
    print(f"{stage}: no target (no speed_0_baseline record in {searched}): training the whole budget")
    return None


def to_a_loss_settings(stage: str, profile: str, speedrun_task: bool) -> dict:
    """The profile's settings a run to a loss of `stage` starts from: the time-to-loss ones or the speedrun's task."""
    return profile_settings(profile, settings_section(stage, True, speedrun_task))


def loss_records_dir(out: Path, stage: str, profile: str, speedrun_task: bool) -> Path:
    """Where a run to a loss keeps its record in `out`: speedrun/, speedrun_baseline_dir or time_to_loss/."""
    if trains_to_a_loss_only(stage):
        return time_to_loss_dir(out, ladder_of(stage))
    return speedrun_baseline_dir(out, profile) if speedrun_task else time_to_loss_dir(out)


def stage_meta(stage: str, profile: str) -> dict:
    """The keys that place a record in its ladder."""
    return {"stage": stage, "ladder": ladder_of(stage), "profile": profile, "parent": parent_of(stage)}


def unfinished_record(stage: str, profile: str, status: str, reason: str, cfg: TrainConfig | None) -> dict:
    """The record of a stage that did not finish (skipped here, a rank or the process died)."""
    record = {**stage_meta(stage, profile), "status": status, "reason": reason, "env": environment()}
    if cfg is not None:
        record["config"] = cfg.to_dict()
    return record


def stage_main(script: str, argv: list[str] | None = None) -> None:
    """Entry point of `python stages/<stage>.py`: run, write the record, print a summary."""
    raise SystemExit(_stage_main(Path(script).stem, sys.argv[1:] if argv is None else argv, script))


@exit_on_user_error
def _stage_main(stage: str, argv: list[str], script: str) -> int:
    args = parse_args(stage, argv)
    dev = device_type(args.device)
    profile = args.profile or default_profile(dev)
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    to_a_loss = args.time_to_loss or args.speedrun_task or args.train_tokens is not None or trains_to_a_loss_only(stage)
    if not to_a_loss and (
        args.full_budget or any(v is not None for v in (args.eval_every_tokens, args.target_loss, args.seed, args.lr))
    ):
        raise UserError(
            "--eval-every-tokens, --target-loss, --seed, --lr and --full-budget set a run to a loss: add --time-to-loss"
        )
    cfg = stage_config(
        stage,
        profile,
        to_a_loss,
        # launched by hand (e.g. several machines): the launcher decides how many processes
        processes=int(os.environ["WORLD_SIZE"]) if distributed.under_torchrun() else None,
        samples=args.samples,
        repeats=args.repeats,
        warmup_iters=args.warmup_iters,
        preset=args.preset,
        n_layer=args.n_layer,
        batch_size=args.batch_size,
        block_size=args.block_size,
        data_dir=data_dir,
        dropout=args.dropout,
        loss_impl=args.loss_impl,
        device=args.device,
        profile_steps=0 if args.no_profiler else None,
        speedrun_task=args.speedrun_task,
        **(to_a_loss_overrides(args, to_a_loss_settings(stage, profile, args.speedrun_task)) if to_a_loss else {}),
    )
    out = writable_dir(Path(args.out or REPO_ROOT / "runs" / f"{profile}-{dev}"))  # before any training
    if trains_to_a_loss_only(stage) and args.target_loss is None:
        cfg.target_loss = default_speedrun_target(stage, out, profile, dev, args.full_budget)
    meta = stage_meta(stage, profile)
    if to_a_loss:
        meta.update(mode="time_to_loss", seed=cfg.seed)
        out = writable_dir(loss_records_dir(out, stage, profile, args.speedrun_task))
    path = record_path(out, stage, other_seed(args.seed, profile))

    launching = parallel.launches(cfg)
    reason = optimizations.why_cannot_run(cfg, dev)
    if reason:
        if int(os.environ.get("RANK", 0)) == 0:
            write_record(path, unfinished_record(stage, profile, "skipped", reason, cfg))
        print(f"error: {stage} cannot run here: {reason} (recorded as skipped)", file=sys.stderr)
        return EXIT_SKIPPED
    if not args.data_dir:
        prepare_if_missing(cfg.data_dir)  # a first run: the profile's data set is made, as run_all does
    if to_a_loss or launching:
        load_prepared(cfg.data_dir)  # missing data or val split: one line now, not one per rank or after training
    if launching:
        path.unlink(missing_ok=True)  # the ranks write a fresh one; a stale one must not pass for it
        failed = distributed.launch(cfg.world_size, [script, *argv])
        record = read_record(path)
        if failed:  # the ranks' record names the first failure, unless a rank died unable to write it
            killed = distributed.killed_from_outside(failed)
            if killed or record is None or record.get("status") == "ok":
                record = unfinished_record(stage, profile, "failed", killed or distributed.how_ended(failed), cfg)
                write_record(path, record)
        if record:
            print_summary(record, out)
        return 1 if failed else 0

    record = _run_and_record(cfg, meta, path, args.wandb)
    if int(os.environ.get("RANK", 0)) == 0:
        print_summary(record, out)
    return 0 if record["status"] == "ok" else 1


def no_effect(stage: str, profile: str, cfg: TrainConfig) -> str | None:
    """'no effect on <device>: <why>' when every optimization this stage changes is inert on that device, else None."""
    parent = parent_of(stage)
    if parent is None:
        return None
    changed = optimizations.changed(stage_config(parent, profile).to_dict(), stage_config(stage, profile).to_dict())
    return optimizations.why_no_effect(changed, cfg, resolve_device(cfg.device))


def _run_and_record(cfg: TrainConfig, meta: dict, path: Path, wandb_mode: str) -> dict:
    """Train and write the record, also for a failed run: by rank 0 and the first rank to fail."""
    import torch

    from gpt import protocol, time_to_loss

    rank = int(os.environ.get("RANK", 0))
    writes = rank == 0
    trace = trace_path(path.parent, meta["stage"])
    if rank == 0:
        trace.unlink(missing_ok=True)  # a trace from an earlier run must not pass for this one's
    try:
        if cfg.train_tokens:
            record = {**meta, **time_to_loss.run(cfg, label=meta["stage"])}
        else:
            record = {
                **meta,
                **protocol.run(
                    cfg,
                    label=meta["stage"],
                    trace_path=trace,
                    memory_snapshot=snapshot_path(path.parent, meta["stage"]),
                ),
            }
        record["no_effect"] = no_effect(meta["stage"], meta["profile"], cfg)
    except UserError:
        raise
    except Exception as e:  # recorded so the ladder goes on, then shown in full
        own = e.__cause__ if isinstance(e, distributed.RankFailed) else e
        if not isinstance(own, torch.OutOfMemoryError):
            traceback.print_exception(own)
        if isinstance(e, distributed.RankFailed):  # the group's first failure, maybe another rank's
            first = e.first
            record = {**meta, "status": first["status"], "reason": f"rank {first['rank']}: {first['reason']}"}
            writes = writes or first["rank"] == rank
        else:
            record = {**meta, **failure_of(e)}
    if not writes:
        return record
    record.setdefault("config", cfg.to_dict())
    record.setdefault("env", environment())
    write_record(path, record)
    if record["status"] == "ok" and wandb_mode != "disabled":
        from gpt.wandb_log import log_run

        log_run(record, mode=wandb_mode, files=[trace] if trace.exists() else [])
    return record


# ---------------------------------------------------------------------------------------------------------
# the human summary at the end of a stage


def print_summary(record: dict, out: Path) -> None:
    stage = record["stage"]
    if record["status"] != "ok":
        print(f"\n{stage}: {record['status']}: {record.get('reason', '')}")
        return
    if record.get("mode") == "time_to_loss":
        return print_loss_summary(record, out)
    m, ch = record["metrics"], record["choices"]
    cfg = record["config"]
    print(f"\n== {stage} ({record['profile']} profile, {record['device']['name']} x{record['device']['count']})")
    print(
        f"  {m['seconds_mean']:.2f} s +- {m['seconds_std']:.2f} per {m['samples_per_repeat']} samples "
        f"({m['steps_per_repeat']} steps of {cfg['batch_size']} per process), {m['tokens_per_s']:,.0f} tokens/s"
    )
    if m.get("compile_s") is not None:
        cache = f", {m['compile_cache']} compile cache" if m.get("compile_cache") else ""
        print(f"  compilation: {m['compile_s']:.1f} s (start-up steps beyond steady ones{cache})")
    mfu = f"{m['mfu_pct']:.1f}%" if m.get("mfu_pct") is not None else "n/a"
    print(
        f"  peak memory {m['peak_memory_mib']:,.1f} MiB ({ch['memory_method']}), "
        f"MFU {mfu} ({m['peak_flops_source']}), data wait {m['data_wait_pct']:.1f}%, "
        f"copy {m['copy_pct']:.1f}%, loss {m['loss_first']:.3f} -> {m['loss_final']:.3f}"
    )
    if m.get("time_breakdown_pct"):
        from gpt.step_profiler import label

        shares = sorted(m["time_breakdown_pct"].items(), key=lambda kv: -kv[1])
        print(
            f"  where the time goes ({m['profiler']['steps']} profiled steps): "
            + ", ".join(f"{label(k)} {v:.0f}%" for k, v in shares if v >= 0.5)
            + (f"; trace {trace_path(out, stage)}" if m["profiler"].get("trace") else "")
        )
    print(
        f"  precision {ch['amp_dtype']}{' + GradScaler' if ch['grad_scaler'] else ''}, "
        f"compile {ch['compile_mode'] or 'off'}, backend {ch['distributed_backend'] or 'single process'}"
    )
    if ran_eager(record):
        print(
            "  warning: torch.compile was on, but the profiled step ran no compiled graph: the model ran eager",
            file=sys.stderr,
        )
    parent = record.get("parent")
    prev = read_record(record_path(out, parent)) if parent else None
    if prev and prev.get("status") == "ok" and prev.get("profile") == record["profile"]:
        dt = 100 * (m["seconds_mean"] / prev["metrics"]["seconds_mean"] - 1)
        new, old, basis = peak_memory_pair(record, prev)
        dm = (
            "not comparable (measured by different methods)"
            if basis == "none"
            else f"{100 * (new / old - 1):+.1f}%" + (" (max_memory_reserved of both)" if basis == "reserved" else "")
        )
        print(f"  vs {parent}: time {dt:+.1f}%, peak memory {dm}")
    print(f"  record: {record_path(out, stage)}")
    if m.get("memory_snapshot"):
        print(
            f"  allocator snapshot of one step: {Path(out) / m['memory_snapshot']} (open it at "
            "https://pytorch.org/memory_viz)"
        )


def process_split(m: dict) -> dict[str, float] | None:
    """Where a run to a loss spent its process's wall clock, part by part, from its metrics; None where not split."""
    if m.get("process_s") is None or m.get("import_setup_s") is None:
        return None
    parts = {
        "imports and arguments": m["import_setup_s"],
        "set-up": m["setup_s"],
        "start-up": m["startup_s"],
        "training": m["train_seconds"],
        "evaluations": m["eval_seconds"],
    }
    return {**parts, "the rest": m["process_s"] - sum(parts.values())}


def print_loss_summary(record: dict, out: Path) -> None:
    """The summary of a run to a loss: the curve's ends, the rate, the target, the record."""
    m, ch = record["metrics"], record["choices"]
    print(
        f"\n== {record['stage']} trained to a loss ({record['profile']} profile, seed {record['seed']}, "
        f"{record['device']['name']} x{record['device']['count']})"
    )
    print(
        f"  {m['tokens']:,} tokens in {m['steps']:,} steps: {m['train_seconds']:.1f} s of training "
        f"({m['tokens_per_s']:,.0f} tokens/s); not in it: start-up {m['startup_s']:.1f} s"
        + (f" ({m['compile_cache']} compile cache)" if m.get("compile_cache") else "")
        + f", {m['evaluations']} evaluations {m['eval_seconds']:.1f} s"
        + (f" ({m['estimates']} of them estimates on fewer windows)" if m.get("estimates") else "")
        + (f", {m['evaluations_skipped']} skipped far above the target" if m.get("evaluations_skipped") else "")
        + (
            f"; {m['minor_faults_per_step']:,.0f} minor page faults a training step"
            if m.get("minor_faults_per_step") is not None
            else ""
        )
    )
    if parts := process_split(m):
        print(
            f"  wall clock of this process to its record {m['process_s']:.1f} s: "
            + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
        )
    trained = m["train_loss_final"] is not None  # no step: a target at or above the untrained model's loss
    print(
        f"  validation loss {m['val_loss_initial']:.3f} -> {m['val_loss_final']:.3f}, "
        + (f"train loss at the end {m['train_loss_final']:.3f}" if trained else "no training step")
    )
    target = m.get("target")
    if m.get("target_loss") is not None:
        reached = (
            f"reached after {target['tokens']:,.0f} tokens, {target['seconds']:.1f} s of training"
            if target
            else "not reached within the budget"
        )
        print(
            f"  target {m['target_loss']:.3f}: {reached}"
            + ("; the run stopped there (--full-budget trains on)" if m.get("stopped_at_target") else "")
        )
    print(
        f"  precision {ch['amp_dtype']}, compile {ch['compile_mode'] or 'off'}, "
        f"backend {ch['distributed_backend'] or 'single process'}"
    )
    seed = record.get("seed")
    print(f"  record: {record_path(out, record['stage'], other_seed(seed, record['profile']))}")

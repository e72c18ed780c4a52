"""The ladders: their order (declared here once), how a stage's config is built, and the runner every
stage script calls.

A stage's config is its profile's baseline settings with the `change()` of every stage up to and including
it applied in ladder order, so each stage keeps every earlier change of its ladder. The two ladders beyond
the book start from a stage of a documented ladder (STARTS_FROM) and keep every change up to it.
"""
import argparse
import importlib.util
import os
import runpy
import sys
import traceback
from pathlib import Path

from gpt import chunked_loss, distributed
from gpt.config import TrainConfig
from gpt.data import REPO_ROOT, load_prepared, prepare_if_missing
from gpt.errors import UserError, exit_on_user_error
from gpt.devices import resolve_device
from gpt.optimizations import why_no_effect
from gpt.profiles import PROFILES, default_profile, profile_settings
from gpt.records import (environment, failure_of, peak_memory_pair, ran_eager, read_record, writable_dir,
                         write_record)

STAGES_DIR = REPO_ROOT / "stages"

LADDERS = {
    "speed": [
        "speed_0_baseline",
        "speed_1_batch_size",
        "speed_2_num_workers",
        "speed_3_non_blocking",
        "speed_4_compile",
        "speed_5_amp",
        "speed_6_ddp",
    ],
    # Beyond the book: today's standard optimizations, one at a time. The order, and why:
    # 1. remove the host-side work first (data), so every later stage is measured with the device fed;
    # 2. then the precision practitioners train in (bf16, no loss scaling; TF32), so the kernel-level stages
    #    after it are measured in that precision;
    # 3. then the kernels, in build-nanogpt's order: fused attention, padded vocabulary, fused AdamW;
    # 4. last the chunked loss, which changes how the output layer computes rather than what it computes.
    "fast": [
        "fast_1_pretokenized",
        "fast_2_bf16",
        "fast_3_sdpa",
        "fast_4_padded_vocab",
        "fast_5_fused_adamw",
        "fast_6_chunked_loss",
    ],
    "memory": [
        "memory_0_baseline",
        "memory_1_grad_accum",
        "memory_2_checkpointing",
        "memory_3_foreach_off",
        "memory_4_fsdp",
    ],
    # Memory beyond the book, on top of FSDP. The order, and why: halve what FSDP gathers and what the blocks
    # keep first (bf16 parameters for compute); then the largest single activation left (the logits); last
    # CPU offload, which costs the most time, so the stages before it are not measured behind its copies.
    "lean": [
        "lean_1_fsdp_bf16",
        "lean_2_chunked_loss",
        "lean_3_cpu_offload",
    ],
}
# A ladder beyond the book continues from this stage of a documented ladder (its settings and profile).
STARTS_FROM = {"fast": "speed_5_amp", "lean": "memory_4_fsdp"}

# What each ladder lowers: "time" ladders get the report's speed table and plot, "memory" ladders the memory ones.
LADDER_GOAL = {"speed": "time", "fast": "time", "memory": "memory", "lean": "memory"}

EXIT_SKIPPED = 3  # a stage that cannot run on this machine (e.g. DDP with one GPU)
# Test-only: a Python file every process of a stage runs first (tests/stage_hooks.py injects a fault into a
# rank, or saves the trained weights), so that tests run the real stage command. Not for users.
TEST_HOOKS_ENV = "GPT_LADDER_TEST_HOOKS"


def ladder_of(stage: str) -> str:
    for ladder, stages in LADDERS.items():
        if stage in stages:
            return ladder
    known = ", ".join(s for stages in LADDERS.values() for s in stages)
    raise UserError(f"unknown stage {stage!r} (known: {known})")


def parent_of(stage: str) -> str | None:
    ladder = ladder_of(stage)
    stages = LADDERS[ladder]
    i = stages.index(stage)
    return stages[i - 1] if i else STARTS_FROM.get(ladder)


def lineage(stage: str) -> list[str]:
    """Every stage whose change this stage keeps, in order, ending with the stage itself."""
    chain = [stage]
    while parent_of(chain[0]):
        chain.insert(0, parent_of(chain[0]))
    return chain


def base_ladder(ladder: str) -> str:
    """The documented ladder whose profile settings a ladder uses."""
    return ladder_of(STARTS_FROM[ladder]) if ladder in STARTS_FROM else ladder


def load_stage(stage: str):
    """The stage script as a module (its docstring, CHANGE, REFERENCE and change())."""
    ladder_of(stage)
    path = STAGES_DIR / f"{stage}.py"
    spec = importlib.util.spec_from_file_location(f"stages.{stage}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stage_config(stage: str, profile: str, **overrides) -> TrainConfig:
    """Profile baseline + every change of the ladder up to `stage`, then explicit overrides."""
    settings = profile_settings(profile, base_ladder(ladder_of(stage)))
    settings["data_dir"] = str(REPO_ROOT / settings["data_dir"])
    cfg = TrainConfig(**settings)
    for name in lineage(stage):
        load_stage(name).change(cfg)
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    return cfg.validate()


# ---------------------------------------------------------------------------------------------------------
# the command line every stage script shares


def parse_args(stage: str, argv: list[str]) -> argparse.Namespace:
    module = load_stage(stage)
    p = argparse.ArgumentParser(
        prog=f"python stages/{stage}.py",
        description=(module.__doc__ or "").strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", help=f"settings profile: {', '.join(PROFILES)} "
                   "(default: reference with CUDA, cpu without)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="where to train")
    p.add_argument("--out", help="directory for the JSON record (default: runs/<profile>-<device>)")
    p.add_argument("--wandb", default="offline", choices=["offline", "online", "disabled"],
                   help="Weights & Biases mode (offline needs no account or network)")
    p.add_argument("--samples", type=int, help="N, samples per timed repeat (all ranks together)")
    p.add_argument("--repeats", type=int, help="timed repeats of N samples")
    p.add_argument("--warmup-iters", type=int, help="untimed warm-up optimizer steps")
    p.add_argument("--preset", help="model preset (gpt-mini, gpt2, gpt2-medium, gpt2-large, gpt2-xl)")
    p.add_argument("--n-layer", type=int, help="override the preset's number of layers")
    p.add_argument("--batch-size", type=int, help="samples per optimizer step and process")
    p.add_argument("--block-size", type=int, help="sequence length (at most the model's 1024 positions)")
    p.add_argument("--data-dir", help="prepared data directory (python data/prepare.py)")
    p.add_argument("--dropout", type=float, help="dropout probability (the profiles use the reference's 0.1)")
    p.add_argument("--loss-impl", choices=["auto", *chunked_loss.IMPLEMENTATIONS],
                   help="who computes the chunked loss (loss='chunked' stages): auto picks the first available "
                   "of torch (PyTorch >= 2.12), liger (liger-kernel), cce (cut-cross-entropy)")
    p.add_argument("--no-profiler", action="store_true",
                   help="skip the profiled steps after timing: no time breakdown, no <stage>.trace.json.gz")
    return p.parse_args(argv)


def device_type(name: str) -> str:
    if name == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def stage_meta(stage: str, profile: str) -> dict:
    """The keys that place a record in its ladder."""
    return {"stage": stage, "ladder": ladder_of(stage), "profile": profile, "parent": parent_of(stage)}


def unfinished_record(stage: str, profile: str, status: str, reason: str, cfg: TrainConfig | None) -> dict:
    """The record of a stage that did not finish (skipped here, a rank or the process died)."""
    record = {**stage_meta(stage, profile), "status": status, "reason": reason, "env": environment()}
    if cfg is not None:
        record["config"] = cfg.to_dict()
    return record


def record_path(out: Path, stage: str) -> Path:
    return Path(out) / f"{stage}.json"


def snapshot_path(out: Path, stage: str) -> Path:
    """The CUDA allocator's snapshot of the stage's instrumented step (pytorch.org/memory_viz opens it)."""
    return Path(out) / f"{stage}.memory.pickle"


def trace_path(out: Path, stage: str) -> Path:
    """The profiler's trace of the stage (gzipped Chrome trace JSON: Perfetto, chrome://tracing)."""
    return Path(out) / f"{stage}.trace.json.gz"


def stage_main(script: str, argv: list[str] | None = None) -> None:
    """Entry point of `python stages/<stage>.py`: run, write the record, print a summary."""
    if os.environ.get(TEST_HOOKS_ENV):
        runpy.run_path(os.environ[TEST_HOOKS_ENV])
    raise SystemExit(_stage_main(Path(script).stem, sys.argv[1:] if argv is None else argv, script))


@exit_on_user_error
def _stage_main(stage: str, argv: list[str], script: str) -> int:
    args = parse_args(stage, argv)
    dev = device_type(args.device)
    profile = args.profile or default_profile(dev)
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    cfg = stage_config(stage, profile, samples=args.samples, repeats=args.repeats,
                       warmup_iters=args.warmup_iters, preset=args.preset, n_layer=args.n_layer,
                       batch_size=args.batch_size, block_size=args.block_size, data_dir=data_dir,
                       dropout=args.dropout, loss_impl=args.loss_impl,
                       device=args.device, profile_steps=0 if args.no_profiler else None)
    out = writable_dir(Path(args.out or REPO_ROOT / "runs" / f"{profile}-{dev}"))  # before any training
    if cfg.distributed and distributed.under_torchrun():
        cfg.nproc = int(os.environ["WORLD_SIZE"])  # launched by hand (e.g. several machines): the launcher decides
        cfg.validate()
    path = record_path(out, stage)
    meta = stage_meta(stage, profile)

    launching = cfg.distributed and not distributed.under_torchrun()
    reason = why_cannot_run(cfg, dev, launching)
    if reason:
        if int(os.environ.get("RANK", 0)) == 0:
            write_record(path, unfinished_record(stage, profile, "skipped", reason, cfg))
        print(f"error: {stage} cannot run here: {reason} (recorded as skipped)", file=sys.stderr)
        return EXIT_SKIPPED
    if not args.data_dir:
        prepare_if_missing(cfg.data_dir)  # a first run: the profile's data set is made, as run_all does
    if launching:
        load_prepared(cfg.data_dir)  # missing data: one line here, not one per rank
        path.unlink(missing_ok=True)  # the ranks write a fresh one; a stale one must not pass for it
        failed = distributed.launch(cfg.nproc, [script, *argv])
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


def why_cannot_run(cfg: TrainConfig, dev: str, launching: bool) -> str | None:
    """Why this stage cannot run on this machine (a 'skipped' record), or None."""
    if cfg.fsdp_cpu_offload and dev != "cuda":
        return ("nothing to offload to: without a GPU, parameters, gradients and optimizer state already live "
                "in host memory")
    if cfg.loss == "chunked" and (reason := chunked_loss.why_unavailable(cfg.loss_impl, dev)):
        return reason
    return distributed.why_cannot_run(cfg.nproc, dev) if launching else None


def no_effect(stage: str, profile: str, cfg: TrainConfig) -> str | None:
    """'no effect on <device>: <why>' when every setting this stage changes is inert on the device it ran on
    (gpt/optimizations.py:why_no_effect), else None. The stage still runs: its time shows the noise."""
    parent = parent_of(stage)
    if parent is None:
        return None
    mine, before = stage_config(stage, profile), stage_config(parent, profile)
    changed = [f for f, v in mine.to_dict().items() if v != getattr(before, f)]
    device = resolve_device(cfg.device)
    reasons = [why_no_effect(f, cfg, device) for f in changed]
    if not changed or None in reasons:
        return None
    return f"no effect on {device.type}: " + "; ".join(dict.fromkeys(reasons))


def _run_and_record(cfg: TrainConfig, meta: dict, path: Path, wandb_mode: str) -> dict:
    """Train and write the record, including for a run that failed (OOM, crash). Rank 0 writes it, and so
    does the rank that failed first: torchrun may stop rank 0 before it can."""
    import torch

    from gpt import protocol

    rank = int(os.environ.get("RANK", 0))
    writes = rank == 0
    trace = trace_path(path.parent, meta["stage"])
    if rank == 0:
        trace.unlink(missing_ok=True)  # a trace from an earlier run must not pass for this one's
    try:
        record = {**meta, **protocol.run(cfg, label=meta["stage"], trace_path=trace,
                                      memory_snapshot=snapshot_path(path.parent, meta["stage"]))}
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
    m, ch = record["metrics"], record["choices"]
    cfg = record["config"]
    print(f"\n== {stage} ({record['profile']} profile, {record['device']['name']} x{record['device']['count']})")
    print(f"  {m['seconds_mean']:.2f} s +- {m['seconds_std']:.2f} per {m['samples_per_repeat']} samples "
          f"({m['steps_per_repeat']} steps of {cfg['batch_size']} per process), {m['tokens_per_s']:,.0f} tokens/s")
    if m.get("compile_s") is not None:
        cache = f", {m['compile_cache']} compile cache" if m.get("compile_cache") else ""
        print(f"  compilation: {m['compile_s']:.1f} s (first step minus a steady step{cache})")
    mfu = f"{m['mfu_pct']:.1f}%" if m.get("mfu_pct") is not None else "n/a"
    print(f"  peak memory {m['peak_memory_mib']:,.1f} MiB ({ch['memory_method']}), "
          f"MFU {mfu} ({m['peak_flops_source']}), data wait {m['data_wait_pct']:.1f}%, "
          f"copy {m['copy_pct']:.1f}%, loss {m['loss_first']:.3f} -> {m['loss_final']:.3f}")
    if m.get("time_breakdown_pct"):
        from gpt.profiling import label

        shares = sorted(m["time_breakdown_pct"].items(), key=lambda kv: -kv[1])
        print(f"  where the time goes ({m['profiler']['steps']} profiled steps): "
              + ", ".join(f"{label(k)} {v:.0f}%" for k, v in shares if v >= 0.5)
              + (f"; trace {trace_path(out, stage)}" if m["profiler"].get("trace") else ""))
    print(f"  precision {ch['amp_dtype']}{' + GradScaler' if ch['grad_scaler'] else ''}, "
          f"compile {ch['compile_mode'] or 'off'}, backend {ch['distributed_backend'] or 'single process'}")
    if ran_eager(record):
        print("  warning: torch.compile was on, but the profiled step ran no compiled graph: the model ran eager",
              file=sys.stderr)
    parent = record.get("parent")
    prev = read_record(record_path(out, parent)) if parent else None
    if prev and prev.get("status") == "ok" and prev.get("profile") == record["profile"]:
        dt = 100 * (m["seconds_mean"] / prev["metrics"]["seconds_mean"] - 1)
        new, old, basis = peak_memory_pair(record, prev)
        dm = "not comparable (measured by different methods)" if basis == "none" else \
            f"{100 * (new / old - 1):+.1f}%" + (" (max_memory_reserved of both)" if basis == "reserved" else "")
        print(f"  vs {parent}: time {dt:+.1f}%, peak memory {dm}")
    print(f"  record: {record_path(out, stage)}")
    if m.get("memory_snapshot"):
        print(f"  allocator snapshot of one step: {Path(out) / m['memory_snapshot']} (open it at "
              "https://pytorch.org/memory_viz)")

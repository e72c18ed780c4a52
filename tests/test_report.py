"""The report (results.md from records) and run_all's orchestration, on synthetic records with the real schema.

results.md's tables, deltas, failed/skipped rows and plots; run_all's resume, records for stages that die, and Ctrl-C.
Fast."""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from unittest import mock

import pytest
from conftest import REPO
from record_schema import record_problems

from gpt import run_all
from gpt.ladder import ladder_of, parent_of, stage_config, stages_of
from gpt.quick_run import NOT_PLANNED
from gpt.records import record_path, write_record
from gpt.report.document import write_report
from gpt.report.readme import run_minutes, run_split, run_time

PNG = b"\x89PNG"
SHARES = {
    "data": 2.0,
    "copy": 0.1,
    "forward": 30.0,
    "backward": 45.0,
    "optimizer": 15.0,
    "communication": 0.0,
    "other": 7.9,
}  # a CPU breakdown, adding up to 100


def fake_record(
    stage: str,
    status: str = "ok",
    seconds: float = 1.0,
    peak: float = 100.0,
    profile: str = "smoke",
    reason: str | None = None,
    **metrics,
) -> dict:
    """A record as a stage script writes it (real config from the stage's ladder position)."""
    cfg = stage_config(stage, profile, device="cpu").to_dict()
    record = {
        "stage": stage,
        "ladder": ladder_of(stage),
        "profile": profile,
        "parent": parent_of(stage),
        "status": status,
        "config": cfg,
        "env": {
            "python": "3.11.7",
            "torch": "2.13.0+cpu",
            "cuda": None,
            "numpy": "2.0",
            "platform": "Linux",
            "git_commit": "0123456789abcdef",
            "time": "2026-01-02T03:04:05+00:00",
        },
    }
    if status != "ok":
        return {**record, "reason": reason or "something broke"}
    steps = cfg["samples"] // cfg["batch_size"]
    world = cfg["nproc"] if cfg["distributed"] else 1
    losses = [4.0 - 0.01 * i for i in range(2 * steps)]
    m = {
        "seconds_mean": seconds,
        "seconds_std": 0.01 * seconds,
        "seconds_per_repeat": [seconds] * 2,
        "samples_per_repeat": cfg["samples"],
        "steps_per_repeat": steps,
        "tokens_per_s": cfg["samples"] * cfg["block_size"] / seconds,
        "step_time_s": seconds / steps,
        "step_time_median_s": seconds / steps,
        "step_times_s": [seconds / steps] * len(losses),
        "first_step_s": 5.0 if cfg["compile"] else 0.1,
        "warmup_s": 5.0,
        "compile_s": 4.9 if cfg["compile"] else None,
        "data_wait_pct": 2.0,
        "copy_pct": 0.1,
        "compile_cache": "warm" if cfg["compile"] else None,
        "time_breakdown_pct": SHARES,
        "profiler": {
            "steps": 2,
            "step_s": seconds / steps,
            "gpu_idle_pct": None,
            "rank": 0,
            "trace": None,
            "compiled_regions_per_step": 1.0 if cfg["compile"] else 0.0,
        },
        "peak_memory_mib": peak,
        "peak_memory_allocated_mib": None,
        "peak_memory_reserved_mib": None,
        "peak_memory_warmup_allocated_mib": None,
        "memory_snapshot": None,
        "memory_breakdown_mib": {
            "parameters": 0.1 * peak,
            "buffers": 0.0,
            "gradients": 0.1 * peak,
            "optimizer_state": 0.2 * peak,
            "activations": 0.5 * peak,
            "temporaries": 0.1 * peak,
            "other": 0.0,
            "total": peak,
        },
        "memory_timeline_mib": [peak * i / 50 for i in range(50)] + [peak * 0.3] * 10,
        "flops_per_token": 1000,
        "peak_flops_per_device": 1e11,
        "peak_flops_source": "measured: test",
        "mfu_pct": 1.5,
        "peak_flops_fastest": 2e11,
        "peak_flops_fastest_source": "measured: test",
        "mfu_fastest_pct": 0.75,
        "loss_first": 4.2,
        "loss_final": losses[-1],
        "losses": losses,
        **metrics,
    }
    return {
        **record,
        "schema": 1,
        "label": stage,
        "metrics": m,
        "model": {"n_layer": 2, "params": 1000, "flops_per_token": 1000},
        "device": {"type": "cpu", "name": "Test CPU", "count": world, "threads_per_process": 2 // world},
        "choices": {
            "amp_dtype": "bfloat16" if cfg["amp"] else "float32",
            "grad_scaler": False,
            "compile_mode": "default" if cfg["compile"] else None,
            "pinned_memory_non_blocking": False,
            "distributed_backend": "gloo" if cfg["distributed"] else None,
            "memory_method": "memtracker",
        },
    }


def write_ladder(out: Path, records: list[dict]) -> None:
    for r in records:
        assert not record_problems(r), record_problems(r)  # the synthetic records follow the real schema
        write_record(record_path(out, r["stage"]), r)


def test_fake_records_are_valid():
    for stage in stages_of("speed") + stages_of("memory"):
        assert not record_problems(fake_record(stage))


def row(md: str, stage: str, table: int = 0) -> list[str]:
    """The stage's row in its ladder's main table (table=1: in the folded second table)."""
    line = [ln for ln in md.splitlines() if ln.startswith(f"| {stage} |")][table]
    return [c.strip() for c in line.strip("|").split("|")]


def details(md: str, stage: str) -> list[str]:
    """The stage's row in the second table: MiB vs prev. or the documented time, tokens/s, MFU, feed, bottleneck."""
    return row(md, stage, table=1)


def test_speed_report_tables_deltas_status_rows_and_plots(tmp_path):
    write_ladder(
        tmp_path,
        [
            fake_record("speed_0_baseline", seconds=8.0, peak=10.0),
            fake_record("speed_1_batch_size", seconds=2.0, peak=40.0),
            fake_record(
                "speed_2_num_workers", seconds=2.1, peak=40.0, data_wait_pct=1.0, time_breakdown_pct=None, profiler=None
            ),  # run with --no-profiler
            fake_record("speed_3_non_blocking", status="failed", reason="RuntimeError: boom"),
            fake_record("speed_4_compile", seconds=1.0, peak=40.0),
            fake_record("speed_5_amp", status="oom", reason="CUDA out of memory. Tried to allocate 2.00 GiB"),
            fake_record("speed_6_ddp", status="skipped", reason="needs 2 GPUs, found 1"),
        ],
    )
    out = write_report(tmp_path)
    md = out.read_text()
    assert out == tmp_path / "results.md"
    assert "## Speed ladder" in md and "## Memory ladder" not in md  # only what was run
    assert "| profile | smoke |" in md and "2.13.0+cpu" in md

    base, batch, workers = row(md, "speed_0_baseline"), row(md, "speed_1_batch_size"), row(md, "speed_2_num_workers")
    assert base[1] == "baseline: batch 2, num_workers 0, raw text tokenised per sample"  # CHANGE, the record's batch
    assert "Ran with: a GPT of " in md and "; batch 2 / 16 (samples per optimizer step); on " in md  # the run's facts
    assert base[2].startswith("8.00 ±")
    assert batch[3:6] == ["-75%", "-75%", "2.28 (-70%)"]  # vs previous, vs baseline, reference (vs prev.)
    assert batch[6] == "40.0" and details(md, "speed_1_batch_size")[1] == "+300%"  # peak memory 10 -> 40 MiB
    assert workers[3:5] == ["+5.0%", "-74%"]
    assert row(md, "speed_3_non_blocking")[2] == "**failed**: RuntimeError: boom"
    assert row(md, "speed_4_compile")[3] == ""  # its parent failed: no comparison across two changes
    assert row(md, "speed_4_compile")[4] == "-88%"
    assert row(md, "speed_5_amp")[2].startswith("**OOM**: CUDA out of memory")
    assert row(md, "speed_6_ddp")[2] == "**skipped**: needs 2 GPUs, found 1"

    assert "Largest gain" not in md.split("## Speed ladder")[1]  # the summary's, not repeated under the table
    summary = md.split("## Summary")[1].split("## Speed ladder")[0]  # at the top, before the tables
    assert (
        "- **Speed ladder** (4 of 7 stages finished), largest gain: here `speed_1_batch_size` (batch size x8), "
        "-75% time; in the documented H100 run: `speed_1_batch_size`, -70%."
    ) in summary
    # no breakdown (--no-profiler): the reason comes from the timed data wait
    assert (
        "`speed_2_num_workers` did not help here (+5.0%): the previous stage hardly waited for data, so "
        "workers had little to win (data wait 2% of the time before, 1% now)" in md
    )
    assert details(md, "speed_2_num_workers")[4:6] == ["1% / 0.1%", ""]  # data wait / copy, no bottleneck
    assert details(md, "speed_1_batch_size")[5] == "backward 45%"
    assert (
        "Compilation (`speed_4_compile`): the first step took 5 s, its start-up steps 4.9 s more than steady ones "
        "(graphs "
        "loaded from the on-disk compile cache an earlier run filled; a first compile on a new machine takes "
        "longer)"
    ) in md
    assert "![speed ladder](plots/speed.png)" in md
    assert (tmp_path / "plots" / "speed.png").read_bytes()[:4] == PNG


def test_report_warns_when_a_compiled_stage_ran_eager(tmp_path):
    eager = fake_record("speed_5_amp", seconds=1.0)
    eager["metrics"]["profiler"]["compiled_regions_per_step"] = 0.0
    write_ladder(tmp_path, [fake_record("speed_4_compile", seconds=1.0), eager])
    md = write_report(tmp_path).read_text()
    assert "Warning: `speed_5_amp` had torch.compile on, but its profiled step ran no compiled graph" in md
    assert "Warning: `speed_4_compile`" not in md


def test_memory_report_partial_ladder_and_planner(tmp_path):
    write_ladder(
        tmp_path,
        [
            fake_record("memory_0_baseline", seconds=3.0, peak=200.0),
            fake_record("memory_1_grad_accum", seconds=3.3, peak=150.0),
            fake_record("memory_2_checkpointing", seconds=4.0, peak=150.0),
        ],
    )
    (tmp_path / "memory_reference.json").write_text(
        json.dumps(
            {
                "kind": "reference",
                "target": "cuda",
                "notes": ["a note"],
                "stages": [
                    {
                        "stage": "memory_0_baseline",
                        "change": "baseline",
                        "estimate_mib": 35000,
                        "documented_mib": 36272,
                        "error_pct": -3.5,
                        "breakdown_mib": {
                            "parameters": 2700,
                            "gradients": 2700,
                            "optimizer_state": 5400,
                            "activations": 22000,
                            "temporaries": 2200,
                        },
                        "snapshot_mib": 34800,
                        "snapshot_error_pct": 0.57,
                        "snapshot_breakdown_mib": {"parameters": 2704, "activations": 23800, "rounding": 73},
                        "estimate_snapshot_categories_mib": {"parameters": 2700, "activations": 22000, "rounding": 0},
                    },
                    {
                        "stage": "memory_2_checkpointing",
                        "change": "checkpointing",
                        "estimate_mib": 13500,
                        "documented_mib": 15394,
                        "error_pct": -12.3,
                    },
                ],
            }
        )
    )
    (tmp_path / "memory_fit.json").write_text(
        json.dumps(
            {
                "kind": "fit",
                "budget_gib": 80,
                "shape_rule": "width 1280",
                "rows": [
                    {
                        "setting": "baseline",
                        "world_size": 1,
                        "n_layer": 90,
                        "params": 1.8e9,
                        "peak_mib": 80000,
                        "documented_params": 1.795e9,
                    }
                ],
            }
        )
    )
    md = write_report(tmp_path, tmp_path / "docs" / "results.md").read_text()
    assert "## Memory ladder" in md and "## Speed ladder" not in md
    assert row(md, "memory_1_grad_accum")[2:6] == ["150", "-25%", "-25%", "25,194 (-31%)"]
    assert row(md, "memory_1_grad_accum")[6] == "3.30 ± 0.033 (+10%)"  # time, and its change vs previous
    assert row(md, "memory_3_foreach_off")[2] == "not run"
    assert "`memory_2_checkpointing` did not lower the peak here (+0.0%)" in md
    assert "## Memory planner" in md
    assert "| memory_0_baseline | baseline | 36,272 | 34,800 | 35,000 | -3.5% | +0.6% |" in md
    assert "| memory_2_checkpointing | checkpointing | 15,394 |  | 13,500 | -12% |  |" in md  # no snapshot
    assert "| activations | 22,000 / 23,800 |" in md and "| rounding | 0.00 / 73.0 |" in md
    assert "| baseline | 1 | 90 | 1,800M | 80,000 | 1,795M |" in md
    plots = tmp_path / "docs" / "plots"
    for name in ("memory.png", "memory_timeline.png", "memory_planner.png"):
        assert (plots / name).read_bytes()[:4] == PNG, name
        assert f"(plots/{name})" in md


def test_planner_section_bounds_offload_by_host_memory_and_says_why_a_cpu_comparison_agrees(tmp_path):
    """The planner's section bounds CPU offload by host memory and says why a CPU comparison agrees.

    A CPU-offload fit that needs more host memory than HOST_GIB_PER_GPU is not a row but a bound in words; a CPU run's
    estimate-vs-measured shows only the stages that differ, and says why the rest agree."""
    write_ladder(tmp_path, [fake_record("memory_0_baseline")])
    offload = "beyond: lean_3, CPU offload (2 GPUs)"
    (tmp_path / "memory_fit.json").write_text(
        json.dumps(
            {
                "kind": "fit",
                "budget_gib": 80,
                "shape_rule": "width 1280",
                "rows": [
                    {"setting": "before (1 GPU)", "world_size": 1, "n_layer": 126, "params": 2.48e9, "peak_mib": 81520},
                    {
                        "setting": offload,
                        "world_size": 2,
                        "n_layer": 16248,
                        "params": 319.719e9,
                        "peak_mib": 81916,
                        "host_mib": 2382 * 1024,
                        "extrapolated": True,
                    },
                ],
                "notes": [f"{offload}: 16248 layers, 319,719M parameters", "before (1 GPU): 126 layers"],
            }
        )
    )
    (tmp_path / "memory_compare.json").write_text(
        json.dumps(
            {
                "kind": "compare",
                "profile": "cpu",
                "stages": [
                    {
                        "stage": "speed_0_baseline",
                        "measured_mib": 589,
                        "measured": "MemTracker's peak",
                        "estimate_mib": 589,
                        "error_pct": 0.0,
                        "target": "cpu",
                    },
                    {
                        "stage": "speed_6_ddp",
                        "measured_mib": 3202,
                        "measured": "MemTracker's peak",
                        "estimate_mib": 3155,
                        "error_pct": -1.5,
                        "target": "cpu",
                    },
                ],
            }
        )
    )
    md = write_report(tmp_path).read_text()
    assert "| before (1 GPU) | 1 | 126 |" in md and f"| {offload}" not in md
    assert f"- {offload}: 16248 layers" not in md and "- before (1 GPU): 126 layers" in md
    assert (
        f"Not in the table: {offload}. Its GPU memory would fit 16,248 layers (319,719M parameters), but "
        "their sharded parameters, gradients and AdamW state would take 2,382 GiB of host memory per GPU; with "
        "256 GiB per GPU, host memory bounds it at about 1,746 layers"
    ) in md
    assert "come from the same tracker (MemTracker)" in md and "1 of 2 stages agree within 0.5%" in md
    assert "| speed_6_ddp | 3,202 |" in md and "| speed_0_baseline | 589 |" not in md


def cuda_record(stage: str, allocated: float, reserved: float | None, **metrics) -> dict:
    """A record as a CUDA run writes it: both peaks, and the one of its method as its peak."""
    record = fake_record(stage, peak=allocated, **metrics)
    method = "cuda_max_reserved" if record["config"]["compile"] else "cuda_max_allocated"
    record["device"].update(type="cuda", name="NVIDIA H100 80GB HBM3")
    record["choices"].update(
        memory_method=method, compile_mode="reduce-overhead" if method == "cuda_max_reserved" else None
    )
    record["metrics"].update(
        peak_memory_allocated_mib=allocated,
        peak_memory_reserved_mib=reserved,
        peak_memory_mib=reserved if method == "cuda_max_reserved" else allocated,
        memory_snapshot=f"{stage}.memory.pickle",
    )
    return record


def test_memory_changes_compare_like_with_like_across_methods(tmp_path, capsys):
    """Memory changes compare like with like: a CUDA-graph stage's reserved peak with its parent's reserved peak.

    CUDA graphs: speed_4's allocated peak (20 MiB) misses the graph pool; its peak is reserved memory (160), compared
    with speed_3's reserved (150), never with its allocated (100). A parent without a reserved figure gives no change at
    all. Every such cell is explained under the table."""
    write_ladder(
        tmp_path,
        [
            cuda_record("speed_0_baseline", 90.0, 120.0),
            cuda_record("speed_1_batch_size", 95.0, 130.0),
            cuda_record("speed_2_num_workers", 95.0, None),  # no reserved figure: as from an older record
            cuda_record("speed_3_non_blocking", 100.0, 150.0),
            cuda_record("speed_4_compile", 20.0, 160.0),
            cuda_record("speed_5_amp", 15.0, 140.0),
        ],
    )
    (tmp_path / "speed_0_baseline.memory.pickle").write_bytes(b"")  # the others' are absent, as in records/
    md = write_report(tmp_path).read_text()
    assert [row(md, "speed_1_batch_size")[6], details(md, "speed_1_batch_size")[1]] == ["95.0", "+5.6%"]  # eager
    assert [row(md, "speed_4_compile")[6], details(md, "speed_4_compile")[1]] == ["160", "+6.7% †"]  # reserved, both
    assert [row(md, "speed_5_amp")[6], details(md, "speed_5_amp")[1]] == ["140", "-12%"]  # both graphs, no mark
    assert (
        "† `speed_4_compile` measures peak memory as cuda_max_reserved, `speed_3_non_blocking` as "
        "cuda_max_allocated: their change compares the max_memory_reserved of both." in md
    )
    assert "because CUDA graphs replay in a private pool that max_memory_allocated does not see" in md
    assert "`speed_0_baseline` as" not in md  # the speed table shows no memory change against the baseline
    assert "open at https://pytorch.org/memory_viz): `speed_0_baseline.memory.pickle`" in md
    assert "`speed_1_batch_size.memory.pickle`" not in md  # a snapshot that is not there is not offered

    older = tmp_path / "older"  # a parent recorded without its reserved figure
    write_ladder(older, [cuda_record("speed_3_non_blocking", 100.0, None), cuda_record("speed_4_compile", 20.0, 160.0)])
    md = write_report(older).read_text()
    assert details(md, "speed_4_compile")[1] == ""
    assert (
        "`speed_4_compile` (cuda_max_reserved) and `speed_3_non_blocking` (cuda_max_allocated) measure peak "
        "memory differently and share no figure, so no memory change is given between them." in md
    )

    from gpt.stage import print_summary

    print_summary(cuda_record("speed_4_compile", 20.0, 160.0), older)
    print_summary(cuda_record("speed_4_compile", 20.0, 160.0), tmp_path)
    out = capsys.readouterr().out
    assert "peak memory not comparable (measured by different methods)" in out
    assert "peak memory +6.7% (max_memory_reserved of both)" in out
    assert "speed_4_compile.memory.pickle (open it at https://pytorch.org/memory_viz)" in out


def shares(**changes) -> dict:
    """SHARES with some categories changed and `other` absorbing the difference, so they add up to 100."""
    out = {**SHARES, **changes}
    out["other"] += 100 - sum(out.values())
    assert out["other"] >= 0
    return out


def test_breakdown_gives_the_bottleneck_one_line_per_stage_and_a_plot(tmp_path):
    write_ladder(
        tmp_path,
        [
            fake_record("speed_0_baseline", seconds=8.0),
            fake_record(
                "speed_1_batch_size", seconds=2.0, time_breakdown_pct=shares(data=31.0, forward=20.0, backward=30.0)
            ),
            fake_record("speed_2_num_workers", seconds=1.5, time_breakdown_pct=shares(data=2.0, backward=40.0)),
            fake_record("speed_3_non_blocking", seconds=1.52, time_breakdown_pct=shares(data=2.0, backward=40.0)),
            fake_record("memory_0_baseline", seconds=3.0),
            fake_record("memory_1_grad_accum", seconds=3.3, status="failed"),
            fake_record("memory_2_checkpointing", seconds=4.0, time_breakdown_pct=shares(forward=15.0, backward=60.0)),
            fake_record(
                "memory_3_foreach_off",
                seconds=5.0,
                time_breakdown_pct=shares(forward=20.0, backward=40.0, optimizer=35.0),
            ),
        ],
    )
    md = write_report(tmp_path).read_text()
    assert details(md, "speed_0_baseline")[5] == "backward 45%"  # the largest share
    assert details(md, "speed_1_batch_size")[5] == "data wait 31%"
    assert details(md, "memory_3_foreach_off")[5] == "backward 40%"
    # the share each change attacks, before -> after, in % of the step and seconds per N samples
    assert "- `speed_2_num_workers` (-25% time): data wait 31% -> 2% (620 ms -> 30 ms; timed repeats: 2% -> 2%)" in md
    assert (
        "- `speed_3_non_blocking` (+1.3% time, within run-to-run noise of ±1%, did not help): copy was 0.1% "
        "and data wait was 2% of the parent's profiled step already (copy 0.1% and data wait 2% of its timed "
        "repeats), and stayed small here, so there was little to remove" in md
    )
    # a change without a target: the category that moved most
    assert "- `speed_1_batch_size` (-75% time): backward 45% -> 30% (3.6 s -> 600 ms)" in md
    assert "`speed_3_non_blocking` did not help here" not in md  # the breakdown replaced the guessed reason
    assert (
        "- `memory_3_foreach_off` (+25% time): optimizer 15% -> 35% (600 ms -> 1.75 s); largest change: "
        "optimizer" not in md
    )  # the target is the largest change: cited once
    assert "- `memory_3_foreach_off` (+25% time): optimizer 15% -> 35% (600 ms -> 1.75 s)" in md
    assert "memory_2_checkpointing` (+" not in md  # its parent failed: nothing to compare with
    assert "## Where the time goes" in md and "![where the time goes](plots/time_breakdown.png)" in md
    assert (tmp_path / "plots" / "time_breakdown.png").read_bytes()[:4] == PNG


@pytest.mark.parametrize(
    "breakdown, data_wait",
    [
        (shares(data=2.0, backward=40.0), 30.0),  # the profiled step small, the timed repeats' wait (the table's) large
        (shares(data=32.0, backward=20.0), 35.0),  # the stage itself added the wait: small in its parent only
    ],
)
def test_a_stage_that_added_data_wait_is_never_told_there_was_little_to_remove(breakdown, data_wait, tmp_path):
    """A stage that added data wait is never told there was little to remove.

    speed_3's change acts on data wait and copy, which held 2% and 0.1% of its parent's step; but the stage's own data
    wait, as its row in the table gives it (the timed repeats), is large: the sentence must not say there was little to
    remove, and it gives both measurements of the wait, each named."""
    write_ladder(
        tmp_path,
        [
            fake_record("speed_0_baseline", seconds=8.0),
            fake_record("speed_1_batch_size", seconds=2.0),
            fake_record("speed_2_num_workers", seconds=1.5, time_breakdown_pct=shares(data=2.0, backward=40.0)),
            fake_record("speed_3_non_blocking", seconds=1.6, time_breakdown_pct=breakdown, data_wait_pct=data_wait),
        ],
    )
    md = write_report(tmp_path).read_text()
    assert details(md, "speed_3_non_blocking")[4] == f"{data_wait:.0f}% / 0.1%"  # the table's data wait / copy
    (line,) = [ln for ln in md.splitlines() if ln.startswith("- `speed_3_non_blocking` (")]
    assert "little to remove" not in line
    assert (
        f"data wait 2% -> {breakdown['data']:.0f}% (30 ms -> {16 * breakdown['data']:.0f} ms; timed repeats: "
        f"2% -> {data_wait:.0f}%)"
    ) in line


def test_ladders_beyond_the_book_compare_with_the_stage_they_continue_from(tmp_path):
    """Ladders beyond the book compare with the stage they continue from, and with speed_0.

    fast_1's 'vs previous' is against speed_5_amp and every fast stage's 'vs baseline' against speed_0; the anchor
    column gives build-nanogpt's change where a stage has one; a stage with no effect on this device says so instead of
    a gain; the lean ladder, with no figures to compare with, has no reference column."""
    speed = [fake_record(s, seconds=8.0 / (i + 1)) for i, s in enumerate(stages_of("speed")[:6])]  # speed_5: 1.33 s
    fast = [
        fake_record("fast_1_pretokenized", seconds=1.0),
        fake_record("fast_2_bf16", seconds=1.01, no_effect_reason="no effect on cpu: nothing to replace"),
        fake_record("fast_3_sdpa", seconds=0.8, time_breakdown_pct=shares(forward=20.0)),
    ]
    for r in fast:
        r["no_effect"] = r["metrics"].pop("no_effect_reason", None)
    lean = [
        fake_record("memory_0_baseline"),
        fake_record("memory_4_fsdp", peak=50.0),
        fake_record("lean_1_fsdp_bf16", peak=40.0),
        fake_record("lean_3_cpu_offload", status="skipped", reason="nothing to offload to"),
    ]
    write_ladder(tmp_path, speed + fast + lean)
    md = write_report(tmp_path).read_text()
    assert "## Fast ladder" in md and "## Lean ladder" in md
    assert row(md, "fast_1_pretokenized")[3:5] == ["-25%", "-88%"]  # vs speed_5_amp (1.33 s), vs speed_0 (8 s)
    assert row(md, "fast_2_bf16")[3] == "+1.0% (no effect)"
    assert row(md, "fast_3_sdpa")[5] == "96 (-26%)"  # build-nanogpt: 130 -> 96 ms per step
    assert row(md, "fast_1_pretokenized")[5] == ""  # no anchor for this one
    assert details(md, "fast_3_sdpa")[3] == "1.5% / 0.8%"  # MFU against its dtype's peak / the fastest
    assert (
        "- `fast_2_bf16`: no effect on cpu: nothing to replace; its time change (+1.0%) is run-to-run variation" in md
    )
    assert "`fast_2_bf16` (+1.0% time" not in md  # no breakdown line reads a gain or loss into it
    assert "- `fast_3_sdpa` (-21% time): forward 30% -> 20% (303 ms -> 160 ms)" in md
    lean_head = next(ln for ln in md.split("## Lean ladder")[1].splitlines() if ln.startswith("| stage |"))
    assert "documented" not in lean_head and "build-nanogpt" not in lean_head
    assert row(md, "lean_1_fsdp_bf16")[3:5] == ["-20%", "-60%"]  # vs memory_4_fsdp, vs memory_0_baseline
    assert row(md, "lean_3_cpu_offload")[2] == "**skipped**: nothing to offload to"
    for name in ("fast.png", "memory.png", "time_breakdown.png"):
        assert (tmp_path / "plots" / name).read_bytes()[:4] == PNG, name
    # the lean ladder continues the memory ladder's figure (memory_4, then lean_1) instead of a figure of its own
    assert not (tmp_path / "plots" / "lean.png").exists() and "plots/lean" not in md
    assert "![memory ladder and lean ladder](plots/memory.png)" in md
    assert (
        "Its stages are drawn in the memory ladder's figures, after `memory_4_fsdp`: "
        "[plots/memory.png](plots/memory.png)." in md.split("## Lean ladder")[1]
    )


def test_report_cli_without_records_is_one_line_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "gpt.report", "--runs", str(tmp_path)], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.startswith("error: no stage records") and "Traceback" not in p.stderr


# ---------------------------------------------------------------------------------------------------------
# run_all (gpt/run_all.py): the decisions, with stub stage processes instead of training


def test_resume_keeps_only_final_records_of_the_same_profile_and_device():
    ok = fake_record("speed_0_baseline")
    assert not run_all.needs_run(ok, "smoke", "cpu")
    assert run_all.needs_run(ok, "cpu", "cpu")  # another profile
    assert run_all.needs_run(ok, "smoke", "cuda")  # another device
    assert run_all.needs_run(None, "smoke", "cpu")
    assert run_all.needs_run(fake_record("speed_0_baseline", status="failed"), "smoke", "cpu")
    for status in ("oom", "skipped"):
        assert not run_all.needs_run(fake_record("speed_6_ddp", status=status), "smoke", "cpu")


def test_resume_reruns_a_skipped_stage_whose_reason_no_longer_holds(tmp_path, monkeypatch):
    """--resume reruns a stage skipped for what this machine lacked once the reason no longer holds.

    A stage skipped for what this machine lacked (the chunked loss before its library was installed, a second GPU) runs
    again on --resume once nothing stops it; while the reason holds, the record is kept."""
    job = run_all.ladder_jobs(["fast_6_chunked_loss"], tmp_path)[0]
    skipped = fake_record("fast_6_chunked_loss", status="skipped")
    monkeypatch.setattr(run_all.optimizations, "why_cannot_run", lambda cfg, device_type: "needs what is missing")
    assert not run_all.needs_run(skipped, "smoke", "cpu", job)
    monkeypatch.setattr(run_all.optimizations, "why_cannot_run", lambda cfg, device_type: None)  # installed since
    assert run_all.needs_run(skipped, "smoke", "cpu", job)
    assert not run_all.needs_run(fake_record("fast_6_chunked_loss", status="oom"), "smoke", "cpu", job)


def test_resume_runs_a_stage_a_quick_run_had_no_time_for_even_where_it_cannot_run():
    """A quick run's "not run" of a stage that cannot run here is no answer: --resume runs it, and it says why.

    Its own "skipped" record is kept while the reason holds (on one GPU, records/h100-2026-11-27 kept speed_6_ddp's "no
    room in the plan" instead)."""
    job = run_all.ladder_jobs(["speed_6_ddp"], Path("/tmp"))[0]
    why = "needs 2 GPUs, found 1"
    command = "./run_all.sh --quick --only speed --resume"
    not_run = fake_record("speed_6_ddp", "skipped", reason=NOT_PLANNED.format(limit="7 min 0 s", command=command))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(run_all.optimizations, "why_cannot_run", lambda cfg, device_type: why)
        assert run_all.needs_run(not_run, "smoke", "cpu", job)
        assert not run_all.needs_run(fake_record("speed_6_ddp", "skipped", reason=why), "smoke", "cpu", job)


STUB = textwrap.dedent("""
    # a stand-in for a stage script: copy the prepared record, or fail the way the test asks
    import os, signal, sys
    stage, out, templates = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(os.path.join(out, "calls.txt"), "a") as f:
        f.write(stage + "\\n")
    with open(os.path.join(out, "arguments.txt"), "a") as f:
        f.write(" ".join([stage, *sys.argv[4:]]) + "\\n")
    behaviour = open(os.path.join(templates, stage + ".how")).read().strip()
    print("stage output line")
    if behaviour == "hang":
        import time
        time.sleep(60)
    if behaviour == "crash":
        print("error: something the stage could not handle", file=sys.stderr)
        sys.exit(1)
    if behaviour == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace(os.path.join(templates, stage + ".json"), os.path.join(out, stage + ".json"))
""")


@pytest.fixture()
def stub_stages(tmp_path, monkeypatch):
    """run_all with every stage replaced by STUB; returns (out dir, set behaviour, calls so far)."""
    out, templates = tmp_path / "out", tmp_path / "templates"
    out.mkdir(), templates.mkdir()
    stub = tmp_path / "stub.py"
    stub.write_text(STUB)
    monkeypatch.setattr(run_all, "prepare_data", lambda profile, ladders: None)
    monkeypatch.setattr(run_all, "calibrate_cpu_peaks", lambda threads, rounds: {"float32 x2 threads": 1e11})
    monkeypatch.setattr(run_all, "matmul_rate", lambda dtype, seconds, rounds: 1e11)
    monkeypatch.setattr(
        run_all,
        "stage_command",
        lambda stage, profile, device, wandb, out: [sys.executable, str(stub), stage, str(out), str(templates)],
    )

    def behave(stage, how, record=None):
        (templates / f"{stage}.how").write_text(how)
        if record:
            (templates / f"{stage}.json").write_text(json.dumps(record))

    def calls():
        path = out / "calls.txt"
        return path.read_text().split() if path.exists() else []

    return out, behave, calls


def test_run_all_records_failures_and_resume_reruns_only_them(stub_stages, monkeypatch):
    out, behave, calls = stub_stages
    speed = stages_of("speed")
    for i, stage in enumerate(speed):
        behave(stage, "ok", fake_record(stage, seconds=8.0 / (i + 1)))
    behave("speed_6_ddp", "ok", fake_record("speed_6_ddp", status="skipped", reason="needs 2 GPUs, found 1"))
    behave("speed_2_num_workers", "crash")
    behave("speed_4_compile", "kill")
    args = ["--profile", "smoke", "--device", "cpu", "--only", "speed", "--out", str(out), "--wandb", "disabled"]

    assert run_all.main(args) == 1  # failures are recorded, the ladder went on, the exit code tells
    assert calls() == speed
    crashed = json.loads((out / "speed_2_num_workers.json").read_text())
    assert crashed["status"] == "failed" and not record_problems(crashed)
    assert crashed["reason"] == "exit code 1 without a record: error: something the stage could not handle"
    assert json.loads((out / "speed_4_compile.json").read_text())["reason"] == "killed by SIGKILL"
    assert (out / "speed_2_num_workers.log").read_text().startswith("stage output line")
    md = (out / "results.md").read_text()
    assert "**failed**: killed by SIGKILL" in md and "**skipped**: needs 2 GPUs, found 1" in md

    behave("speed_2_num_workers", "ok", fake_record("speed_2_num_workers"))
    behave("speed_4_compile", "ok", fake_record("speed_4_compile"))
    monkeypatch.setattr(run_all, "still_runs", lambda job, profile, device: False)  # still one GPU
    assert run_all.main(args + ["--resume"]) == 0
    assert calls() == speed + ["speed_2_num_workers", "speed_4_compile"]  # ok and skipped stages kept
    assert "**failed**" not in (out / "results.md").read_text()
    machine = json.loads((out / "machine.json").read_text())  # the run's wall clock, for the README's run time
    assert machine["wall_s"] > 0 and machine["finished"] >= machine["started"]
    assert run_minutes(out) == f"{machine['wall_s'] / 60:.0f} min" and "the planner and the report" in run_split(out)


def test_no_profiler_reaches_every_stage(stub_stages, monkeypatch):
    out, _, _ = stub_stages
    commands = []
    monkeypatch.setattr(run_all, "run_stage", lambda cmd, log, show, deadline=None: commands.append(cmd) or 1)
    run_all.main(
        [
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--only",
            "speed",
            "--out",
            str(out),
            "--wandb",
            "disabled",
            "--no-profiler",
        ]
    )
    assert len(commands) == len(stages_of("speed")) and all(cmd[-1] == "--no-profiler" for cmd in commands)


def test_interrupt_stops_the_ladder_and_still_writes_the_report(stub_stages, monkeypatch):
    out, behave, calls = stub_stages
    for stage in stages_of("memory"):
        behave(stage, "ok", fake_record(stage))
    real_run_stage = run_all.run_stage

    def interrupted_second(cmd, log, show, deadline=None):
        if cmd[2] == "memory_1_grad_accum":
            raise KeyboardInterrupt
        return real_run_stage(cmd, log, show, deadline)

    monkeypatch.setattr(run_all, "run_stage", interrupted_second)
    args = ["--profile", "smoke", "--device", "cpu", "--only", "memory", "--out", str(out), "--wandb", "disabled"]
    assert run_all.main(args) == 130
    assert calls() == ["memory_0_baseline"]  # nothing after the interrupted stage
    assert json.loads((out / "memory_1_grad_accum.json").read_text())["reason"].startswith("interrupted")
    md = (out / "results.md").read_text()
    assert "1 of 5 stages finished" in md and row(md, "memory_2_checkpointing")[2] == "not run"


def test_interrupt_stops_the_stage_and_everything_it_started(tmp_path):
    """Ctrl-C during a stage: the stage and its children (torchrun's ranks, DataLoader workers) all end."""
    pids = tmp_path / "pids"
    script = (
        f"import os, subprocess, time; c = subprocess.Popen(['sleep', '60']); "
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{c.pid}}'); time.sleep(60)"
    )

    def show(seconds):
        if pids.exists() and pids.read_text():
            raise KeyboardInterrupt  # what Ctrl-C does to run_all while it waits

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        run_all.run_stage([sys.executable, "-c", script], tmp_path / "x.log", show)
    assert time.monotonic() - t0 < 30
    for pid in map(int, pids.read_text().split()):
        assert not running(pid)


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait a while for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_report_states_the_cpu_peaks_and_warns_when_the_host_sped_up(stub_stages, monkeypatch):
    """The report states the CPU's matmul peaks and warns when the host sped up during the run.

    run_all measures the CPU's matmul peaks before the first stage and fp32 again after the last; the header gives both,
    and warns when the end's is >5% higher (the start's peak, the MFU basis, was low)."""
    out, behave, _ = stub_stages
    calibrations = []
    monkeypatch.setattr(
        run_all,
        "calibrate_cpu_peaks",
        lambda threads, rounds: (
            calibrations.append((threads, rounds))
            or {"float32 x2 threads": 100e9, "bfloat16 x2 threads": 1e9, "float32 x1 threads": 50e9}
        ),
    )
    args = ["--profile", "smoke", "--device", "cpu", "--only", "speed", "--out", str(out), "--wandb", "disabled"]
    for end, warned in ((103e9, False), (130e9, True)):
        for stage in stages_of("speed"):
            behave(stage, "ok", fake_record(stage))
        monkeypatch.setattr(run_all, "matmul_rate", lambda dtype, seconds, rounds, end=end: end)
        monkeypatch.setattr(run_all.torch, "get_num_threads", lambda: 2)
        assert run_all.main(args) == 0
        md = (out / "results.md").read_text()
        assert "float32 x2 threads: 100.0 GFLOP/s; bfloat16 x2 threads: 1.0 GFLOP/s" in md
        assert f"float32 x2 threads after the last stage: {end / 1e9:.1f}" in md
        assert ("30% faster after the last stage" in md) == warned
    assert calibrations[0] == ([2, 1], 1)  # both thread counts the stages use; smoke: one round


def test_a_quick_run_keeps_its_limit_marks_its_records_and_publishes_nothing(
    stub_stages, tmp_path, monkeypatch, capsys
):
    """A --quick run keeps its limit, marks its records as quick, and publishes nothing over the committed ones.

    --quick: the plan first; the timed stages at fewer repeats; a stage still running at the limit is stopped, those
    after it are recorded as not run; every record says quick and its wall clock; the report is written beside the
    records, never over the committed ones; --resume completes the run."""
    _, behave, _ = stub_stages
    monkeypatch.setattr(run_all, "REPO_ROOT", tmp_path)  # the default folder: <repo>/runs/smoke-cpu-quick
    monkeypatch.setattr(run_all, "publish", lambda *a: pytest.fail("a quick run published its records"))
    quick_out = tmp_path / "runs" / "smoke-cpu-quick"
    speed = stages_of("speed")
    for stage in speed:
        behave(stage, "ok", fake_record(stage))
    behave("speed_1_batch_size", "hang")
    args = ["--profile", "smoke", "--device", "cpu", "--only", "speed", "--wandb", "disabled", "--quick"]
    assert run_all.main(args + ["--time-limit", "0.05"]) == 1  # 3 s: speed_1 is stopped there
    printed = capsys.readouterr().out
    assert printed.index("== quick run: a first look within 3 s") < printed.index("[ 1/7] speed_0_baseline")
    assert "0 s  speed: speed_0_baseline  (no figure: the limit bounds it)" in printed  # smoke: no records
    records = {s: json.loads((quick_out / f"{s}.json").read_text()) for s in speed}
    assert records["speed_0_baseline"]["status"] == "ok" and records["speed_0_baseline"]["run"]["quick"] is True
    assert records["speed_1_batch_size"]["reason"] == "stopped at the quick run's 3 s limit (--resume runs it again)"
    assert all(
        records[s]["status"] == "skipped" and records[s]["reason"].startswith("not run: the quick run's 3 s")
        for s in speed[2:]
    )
    first = (quick_out / "arguments.txt").read_text().splitlines()[0]
    assert first == "speed_0_baseline --repeats 2 --warmup-iters 1"  # the smoke profile's 1 warm-up step kept
    assert "**A quick run**" in (quick_out / "results.md").read_text()
    assert not (tmp_path / "results.md").exists()

    for stage in speed[1:]:
        behave(stage, "ok", fake_record(stage))
    assert run_all.main(args + ["--resume"]) == 0  # the default limit: time enough
    assert "speed: speed_0_baseline" not in capsys.readouterr().out  # kept: not in the plan
    assert (quick_out / "calls.txt").read_text().split() == speed[:2] + speed[1:]


def advancing_clock(monkeypatch, seconds_a_stage: float) -> None:
    """A quick run's clock that moves only as its stages run, `seconds_a_stage` each (a stub stage takes none)."""
    spent = [0.0]
    real = run_all.run_stage

    def run_stage(cmd, log, show, deadline=None):
        spent[0] += seconds_a_stage
        return real(cmd, log, show)

    monkeypatch.setattr(run_all, "run_stage", run_stage)
    monkeypatch.setattr(run_all.quick_run.Deadline, "left", lambda self: self.limit_s * (1 - self.reserve) - spent[0])


def quick_speed_ladder(stub_stages, monkeypatch, seconds_a_stage: float) -> list[str]:
    """The arguments of a quick run of the speed ladder's stub stages in 2 minutes (114 s for the stages).

    Each stage is planned at a minute (a stage that cannot run here at its start-up) and takes `seconds_a_stage`."""
    out, behave, _ = stub_stages
    for stage in stages_of("speed"):
        behave(stage, "ok", fake_record(stage))
    monkeypatch.setattr(
        run_all.quick_run.Figures,
        "seconds",
        lambda self, stage, rel, to_a_loss: (*(self.start_up_only(stage, rel, to_a_loss) or (60.0, "a minute")), None),
    )
    advancing_clock(monkeypatch, seconds_a_stage)
    args = ["--profile", "smoke", "--device", "cpu", "--only", "speed", "--quick", "--time-limit", "2"]
    return args + ["--out", str(out), "--wandb", "disabled"]


def test_a_quick_run_records_what_its_plan_leaves_out_with_the_command_that_runs_it(stub_stages, monkeypatch):
    """The stage runs a quick run's plan has no room for are never started, and their records say how to run them."""
    out, _, calls = stub_stages
    speed = stages_of("speed")
    args = quick_speed_ladder(stub_stages, monkeypatch, 60.0)  # as planned: no time left for what the plan left out
    assert run_all.main(args) == 0  # 114 s for the stages: one fits
    assert calls() == speed[:1]
    command = f"./run_all.sh --quick --only speed --profile smoke --device cpu --out {out} --wandb disabled --resume"
    for stage in speed[1:]:
        record = json.loads((out / f"{stage}.json").read_text())
        assert record["status"] == "skipped"
        assert (
            record["reason"] == f"not run: the quick run's plan for 2 min 0 s had no room for it (`{command}` runs it)"
        )


def test_a_quick_run_runs_what_its_plan_left_out_where_time_is_left_and_records_its_timing(
    stub_stages, monkeypatch, capsys
):
    """Reflow: a stage the plan left out runs where the time left covers it; <out>/quick_run.json says how it went.

    At a minute a stage, 2 minutes (114 s for the stages) plan speed_0 alone; the stages take 30 s, so speed_1 runs
    too (84 s left), and speed_2 (54 s left) is recorded as not run. quick_run.json holds the limit, the plan, the wall
    clock and each item, planned and measured; a --resume into the folder adds its run, a fresh run starts the list."""
    out, behave, calls = stub_stages
    speed = stages_of("speed")
    args = quick_speed_ladder(stub_stages, monkeypatch, 30.0)
    assert run_all.main(args) == 0
    assert calls() == speed[:2]
    assert "   time left: running speed_1_batch_size, which the plan left out" in capsys.readouterr().out.splitlines()
    reason = json.loads((out / "speed_2_num_workers.json").read_text())["reason"]
    assert reason.startswith("not run: the quick run's plan for 2 min 0 s had no room for it")
    (run,) = json.loads((out / "quick_run.json").read_text())["runs"]
    assert run["limit_s"] == 120 and run["planned_s"] == 60 and 0 <= run["wall_s"] < 60
    assert run["started"] <= run["ended"] and run["ended"].endswith("+00:00")
    ran = [(item["name"], item["ran"], item["reflowed"], "wall_s" in item) for item in run["items"]]
    assert ran == [(speed[0], True, False, True), (speed[1], True, True, True)] + [
        (s, False, False, False) for s in speed[2:]
    ]
    assert run["items"][0] | {"wall_s": 0} == {
        "section": "speed",
        "name": speed[0],
        "planned_s": 60,
        "why": "a minute",
        "ran": True,
        "reflowed": False,
        "wall_s": 0,
    }

    assert run_all.main(args + ["--resume"]) == 0  # the clock at 60 s: speed_2, planned, runs
    first, second = json.loads((out / "quick_run.json").read_text())["runs"]
    assert first == run and [(item["name"], item["ran"]) for item in second["items"][:2]] == [
        (speed[2], True),
        (speed[3], False),
    ]
    for stage in speed:
        behave(stage, "ok", fake_record(stage))
    assert run_all.main(args) == 0  # not resumed: a new list
    assert len(json.loads((out / "quick_run.json").read_text())["runs"]) == 1


def test_a_quick_run_starts_a_stage_that_cannot_run_here_whatever_its_room_so_its_record_says_why(
    stub_stages, monkeypatch, capsys
):
    """A stage that cannot run here is in a quick run's plan wherever it stands, at its start-up: its record says why.

    On one GPU speed_6_ddp (two processes) was recorded "not run: no room in the plan" (records/h100-2026-11-27)."""
    out, behave, calls = stub_stages
    speed, why = stages_of("speed"), "needs 2 GPUs, found 1"
    args = quick_speed_ladder(stub_stages, monkeypatch, 60.0)
    behave("speed_6_ddp", "ok", fake_record("speed_6_ddp", "skipped", reason=why))
    monkeypatch.setattr(
        run_all.optimizations, "why_cannot_run", lambda cfg, device: why if cfg.world_size > 1 else None
    )
    assert run_all.main(args) == 0
    assert calls() == [speed[0], "speed_6_ddp"]  # 114 s: speed_0 and speed_6's start-up; 54 s left then
    assert json.loads((out / "speed_6_ddp.json").read_text())["reason"] == why
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "speed: speed_6_ddp" in line]
    assert line.split()[:2] == ["10", "s"] and line.endswith(f"records itself skipped: {why})")


@pytest.mark.slow
def test_a_quick_run_at_smoke_shapes_trains_every_section_it_plans(tmp_path):
    """`./run_all.sh --quick` for real on the smoke profile trains every section it plans.

    Minutes on 2 cores: the speed and fast ladders and the speedrun, each stage a real record marked quick, and a page
    that says so."""
    out = tmp_path / "quick"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpt.run_all",
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--quick",
            "--out",
            str(out),
            "--wandb",
            "disabled",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    speedrun = sorted(p.stem for p in (out / "speedrun").glob("speedrun_*.json"))
    assert speedrun == stages_of("speedrun")
    for path in [*out.glob("speed_*.json"), *out.glob("fast_*.json"), *(out / "speedrun").glob("*.json")]:
        record = json.loads(path.read_text())
        assert record["status"] == "ok" and record["run"]["quick"], path
    assert "**A quick run**" in (out / "results.md").read_text()


def test_the_run_says_at_its_start_what_cannot_run_here(capsys, monkeypatch):
    """The run says at its start what cannot run here: one line per stage that will record itself skipped.

    Here lean_3 (nothing to offload to on a CPU). The chunked-loss stages run on a torch without PyTorch's op (as on
    torch 2.11): the plain-PyTorch implementation stands in (gpt/optimizations/chunked_loss.py)."""
    from gpt.optimizations import chunked_loss

    monkeypatch.setattr(chunked_loss, "torch_op_takes_our_call", lambda: False)
    stages = ["fast_5_fused_adamw", "fast_6_chunked_loss", "lean_2_chunked_loss", "lean_3_cpu_offload"]
    run_all.say_what_cannot_run(run_all.ladder_jobs(stages, Path("/tmp")), "smoke", "cpu")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["lean_3_cpu_offload"]
    assert "cannot run here: nothing to offload to: without a GPU" in lines[0]
    assert run_all.loss_stages(["speedrun"]) == ["speed_0_baseline", *stages_of("speedrun")]


@pytest.mark.parametrize("how", ["interrupted", "--only"])
def test_a_run_that_does_not_finish_whole_leaves_the_committed_page_as_it_was(how, stub_stages, tmp_path, monkeypatch):
    """A run that does not finish whole leaves the committed records and results.md as they were.

    A default run stopped after its first stages, or one of a single ladder, once replaced every committed record and
    results.md with its own few: now it writes its report beside its records and the committed ones stay."""
    _, behave, _ = stub_stages
    committed = tmp_path / "records" / "smoke-cpu"
    committed.mkdir(parents=True)
    (committed / "speed_0_baseline.json").write_text("{}")
    (tmp_path / "results.md").write_text("the committed page\n")
    monkeypatch.setattr(run_all, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(run_all, "published_dir", lambda profile, device: committed)
    for ladder in ("speed", "fast"):
        for stage in stages_of(ladder):
            behave(stage, "ok", fake_record(stage))
    if how == "interrupted":
        real = run_all.run_stage

        def stop_at_fast(cmd, log, show, deadline=None):
            if "fast_1_pretokenized" in cmd:
                raise KeyboardInterrupt
            return real(cmd, log, show, deadline)

        monkeypatch.setattr(run_all, "run_stage", stop_at_fast)
        args = []
    else:
        args = ["--only", "speed"]
    run_all.main(["--profile", "smoke", "--device", "cpu", "--wandb", "disabled", *args])
    assert (tmp_path / "results.md").read_text() == "the committed page\n"
    assert [p.name for p in committed.iterdir()] == ["speed_0_baseline.json"]
    assert (tmp_path / "runs" / "smoke-cpu" / "results.md").is_file()  # its own report, beside its records


def test_a_quick_run_out_of_time_records_every_speedrun_stage_as_not_run(stub_stages, tmp_path, monkeypatch):
    """No ladder disappears: where the limit comes before speed_0, the speedrun's stages are there too, not run."""
    out, _, calls = stub_stages
    monkeypatch.setattr(
        run_all.quick_run.Deadline,
        "starting_now",
        classmethod(lambda cls, limit_min: cls(60 * limit_min, time.monotonic() - 60)),
    )  # spent
    run_all.main(
        [
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--only",
            "speedrun",
            "--quick",
            "--time-limit",
            "0.001",
            "--out",
            str(out),
            "--wandb",
            "disabled",
        ]
    )
    assert calls() == []
    folder = out / "speedrun"
    reasons = {p.stem: json.loads(p.read_text())["reason"] for p in folder.glob("speedrun_*.json")}
    assert sorted(reasons) == sorted(stages_of("speedrun")) and all(
        r.startswith("not run: the quick run's") for r in reasons.values()
    )


# ---- the page's layout (issue 43, "the first ten minutes") --------------------------------------------------

COMMITTED = REPO / "records" / "cpu-cpu"
MEASUREMENT = REPO / "docs" / "measurement.md"


def columns(line: str) -> int:
    """The cells of a Markdown table row (an escaped pipe inside a cell is no border)."""
    return line.replace("\\|", "").strip().strip("|").count("|") + 1


@pytest.fixture(scope="module")
def committed_page(tmp_path_factory) -> tuple[str, Path]:
    """The page of the committed CPU run (every section: ladders, time to loss, speedrun, planner), in a temp dir."""
    out = tmp_path_factory.mktemp("page") / "results.md"
    return write_report(COMMITTED, out).read_text(), out.parent / "plots"


def resolved_links(text: str, folder: Path) -> str:
    """A page's text with each link into the repo written as the absolute path it points to from `folder`.

    Its own plots (plots/ beside the page) stay as they are."""

    def resolve(m: re.Match) -> str:
        return f"]({os.path.normpath(folder / m[1])}{m[2]})"

    return re.sub(r"\]\((?!https?:|#|plots/)([^)\s#]+)((?:#[^)\s]*)?)\)", resolve, text)


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="records/cpu-cpu is missing from this checkout")
def test_the_committed_results_page_is_what_the_report_writes_from_the_committed_records(committed_page):
    """results.md is generated, never edited: it equals what `python -m gpt.report` writes from records/cpu-cpu."""
    md, plots = committed_page
    assert resolved_links(md, plots.parent) == resolved_links((REPO / "results.md").read_text(), REPO)


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="records/cpu-cpu is missing from this checkout")
@pytest.mark.parametrize("folder", ["cpu-cpu", "cpu-epyc-avx2-2026-11-28"])  # bf16 units; bf16 emulated
def test_the_run_time_footnote_compares_bf16_with_fp32_either_way(folder):
    """The footnote says how bf16's measured matmul peak compares with fp32's, faster or slower, from machine.json.

    On a CPU that emulates bf16 its peak is about a hundredth of fp32's: "Nx slower", not "0.0x as fast"."""
    runs = REPO / "records" / folder
    peaks = json.loads((runs / "machine.json").read_text())["cpu_peaks_gflops"]
    fp32, bf16 = peaks["float32 x2 threads"], peaks["bfloat16 x2 threads"]
    ratio = f"{bf16 / fp32:.1f}x as fast as" if bf16 >= fp32 else f"{fp32 / bf16:.0f}x slower than"
    assert f"whose bf16 matmuls ran {ratio} its fp32 ones" in run_time(runs)
    assert "0.0x" not in run_time(runs)


def test_the_readmes_generated_blocks_are_what_the_report_writes_from_the_committed_records():
    """README.md's figures between generation markers equal what `python -m gpt.report` writes from records/cpu-cpu."""
    from gpt.report.readme import BLOCK, README_RECORDS, rewritten

    readme = (REPO / "README.md").read_text()
    assert {
        "faster-step-headline",
        "speedrun-headline",
        "speedrun-table",
        "planner-headline",
        "gpu-memory",
        "models",
        "cpu-run-time",
        "cpu-run-minutes",
        "cpu-run-split",
        "try-output",
        "gpu-memory-peaks",
    } <= {m["name"] for m in BLOCK.finditer(readme)}
    assert README_RECORDS == COMMITTED and rewritten(readme, COMMITTED) == readme
    # the GPU paragraph's peaks are the largest of the memory table's cells, ladder by ladder
    made = {m["name"]: m["body"] for m in BLOCK.finditer(readme)}
    rows = {row.split("|")[1].strip(): row for row in made["gpu-memory"].splitlines() if row.startswith("| ")}
    for ladder, peak in re.findall(r"(\w+) up to ([\d.]+) GiB", made["gpu-memory-peaks"]):
        cells = [float(x) for x in re.findall(r"` ([\d.]+)", rows[ladder].split("|")[2])]
        assert float(peak) == max(cells)


def figures_not_drawn(monkeypatch) -> None:
    """Every report figure built but not drawn (no layout, no PNG): a page's text, seconds sooner (tests of the pages).

    The figures themselves are checked by their own tests; what a page says of them comes before they are saved."""
    from gpt.report import figures, memory_planner, plots, speedrun, time_to_loss

    def close(fig, path, layout: bool = True) -> None:
        plots.pyplot().close(fig)

    for module in (plots, memory_planner, time_to_loss, figures, speedrun):
        monkeypatch.setattr(module, "save_figure", close)


@pytest.mark.parametrize("folder", sorted(p.parent.name for p in (REPO / "records").glob("*/results.md")))
def test_each_committed_gpu_page_is_what_the_report_writes_from_its_records(folder, tmp_path, monkeypatch):
    """Each records/<gpu>/results.md equals what `python -m gpt.report --runs records/<gpu>` writes now."""
    figures_not_drawn(monkeypatch)
    out = write_report(REPO / "records" / folder, tmp_path / "results.md")
    committed = REPO / "records" / folder
    assert resolved_links(out.read_text(), tmp_path) == resolved_links(
        (committed / "results.md").read_text(), committed
    )


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="records/cpu-cpu is missing from this checkout")
def test_the_page_opens_with_its_summary_and_no_table_is_wider_than_seven_columns(committed_page):
    """The page opens with its summary, and no table is wider than seven columns.

    The summary comes first, the machine after it (folded); every table of the whole page has at most 7 columns; the
    columns are defined in docs/measurement.md, each table linking to its section, not repeated per ladder."""
    from gpt.report.document import MAX_COLUMNS

    md, _ = committed_page
    headings = [ln for ln in md.splitlines() if ln.startswith("## ")]
    assert headings[0] == "## Summary"
    assert md.index("## Summary") < md.index("| device |") < md.index("## Speed ladder")
    assert md.index("<details><summary>Machine and software") < md.index("| device |")
    wide = [ln[:80] for ln in md.splitlines() if ln.startswith("|") and columns(ln) > MAX_COLUMNS]
    assert MAX_COLUMNS == 7 and wide == []
    anchors = {m.lower().replace(" ", "-") for m in re.findall(r"^### (.+)$", MEASUREMENT.read_text(), flags=re.M)}
    links = re.findall(r"\]\([^)]*docs/measurement\.md#([\w-]+)\)", md)
    assert {"the-speed-and-fast-tables", "the-memory-and-lean-tables", "the-time-to-loss-table"} <= set(links)
    assert set(links) <= anchors  # every link lands on a section
    assert "**s / 128 samples**: seconds to train" not in md and "**tokens/s**: training tokens" not in md


@pytest.mark.skipif(not COMMITTED.is_dir(), reason="records/cpu-cpu is missing from this checkout")
@pytest.mark.parametrize("folder", ["cpu-cpu", "h200-2026-11-28"])
def test_the_waterfalls_labels_stay_apart_and_inside_on_the_committed_runs(folder):
    """Every label of a committed run's waterfall is clear of every other and inside the axes; the title inside.

    Seen failing on the waterfall before it (four lines a bar at 7 pt: its factors, tokens and margins ran into their
    neighbours' on records/cpu-cpu's twenty stages)."""
    import itertools

    from gpt.report.speedrun import Speedrun, draw_waterfall

    sr = Speedrun(REPO / "records" / folder)
    fig = draw_waterfall(sr)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    assert len(boxes) == 1 + len(sr.stages)  # speed_0's and one a stage, run or not
    crossing = [(a.get_text(), b.get_text()) for a, b in itertools.combinations(ax.texts, 2)
                if a.get_window_extent(renderer).overlaps(b.get_window_extent(renderer))]  # fmt: skip
    assert not crossing
    inside = ax.get_window_extent(renderer)
    assert all(inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1 for b in boxes)
    title = ax.title.get_window_extent(renderer)
    assert 0 <= title.x0 and title.x1 <= fig.bbox.x1 and title.y1 <= fig.bbox.y1


def test_the_page_draws_the_thesis_the_waterfall_and_one_change_across_machines(committed_page):
    """The page draws the thesis, the waterfall and one change across machines, from the records.

    Three figures from the records, each written and embedded; the lean ladder is drawn in the memory figure; the
    speedrun's record table with the task above it; the planner's forensics left to gpt/memory/README.md."""
    md, plots = committed_page
    for name in ("thesis.png", "speedrun_waterfall.png", "machines.png", "memory.png"):
        assert (plots / name).read_bytes()[:4] == PNG, name
        assert f"(plots/{name})" in md, name
    assert not (plots / "lean.png").exists() and not (plots / "lean_timeline.png").exists()
    machines = md.split("## One change across machines")[1].split("\n## ")[0]
    machine = json.loads((REPO / "records" / "cpu-cpu" / "machine.json").read_text())  # its CPU's kind, as it names it
    assert f"- `records/cpu-cpu`: {machine['cpu_count']}-core {machine['cpu']}, profile cpu." in machines
    assert "the book's documented H100 run" in machines
    gpu_folders = [f.name for f in (REPO / "records").glob("h*") if f.is_dir()]
    unfinished = [f for f in gpu_folders if f"- `records/{f}`: NVIDIA" not in machines]
    assert unfinished == ["h200-2026-12-04"]  # a quick run with no room for a ladder: listed, without a bar
    unfinished_line = "- `records/h200-2026-12-04`: no bar, none of these stages finished there (its note.md says why)."
    assert unfinished_line in machines
    speedrun = md.split("## Speedrun")[1]
    task = speedrun.index("Task: train from scratch to validation loss 1.895")
    assert task < speedrun.index("| # | change | training s | wall s | x vs speed_0 | tokens | record |")
    assert "| 6 | a learned bigram embedding" in speedrun  # its margin: the tokens left of its budget
    assert re.search(r"\| 6 \| a learned bigram embedding.* of 384,000 \(\d+% left\) \|", speedrun)
    assert "[records/cpu-cpu/speedrun/speedrun_6_bigram.json](" in speedrun
    planner = md.split("## Memory planner")[1]
    assert "Blocks over 1 MiB allocated anew every step" not in planner and "| figure | value |" not in planner
    assert "gpt/memory/README.md](" in planner and "| stage | change | documented MiB |" in planner


def test_the_machines_figure_names_each_series_machine(tmp_path):
    """A page's own run and every committed records folder with speed stages, beside the documented changes."""
    write_ladder(
        tmp_path, [fake_record("speed_0_baseline", seconds=8.0), fake_record("speed_1_batch_size", seconds=2.0)]
    )
    md = write_report(tmp_path).read_text()
    assert f"- `{tmp_path}`: Test CPU (its kind not recorded), profile smoke." in md  # no machine.json
    assert "- the book's documented H100 run: each stage script's REFERENCE seconds." in md
    assert (tmp_path / "plots" / "machines.png").read_bytes()[:4] == PNG
    only_memory = tmp_path / "memory"
    write_ladder(only_memory, [fake_record("memory_0_baseline")])
    assert "## One change across machines" not in write_report(only_memory).read_text()  # nothing of its own


def test_the_memory_figure_runs_on_into_the_lean_ladder(tmp_path, monkeypatch):
    """One memory figure for both memory ladders, lean continuing from memory_4; no lean figure of its own."""
    from gpt.report import document

    drawn = {}
    monkeypatch.setattr(document, "plot_memory", lambda rungs, path, title: drawn.update({path.name: rungs}))
    monkeypatch.setattr(document, "plot_timelines", lambda rungs, path: drawn.update({path.name: rungs}) or True)
    write_ladder(
        tmp_path,
        [fake_record("memory_0_baseline"), fake_record("memory_4_fsdp", peak=50.0), fake_record("lean_1_fsdp_bf16")],
    )
    md = write_report(tmp_path).read_text()
    assert drawn.keys() == {"memory.png", "memory_timeline.png"}
    for rungs in drawn.values():
        assert [r.stage for r in rungs] == stages_of("memory", "lean")
    assert "plots/lean" not in md


def test_the_readmes_try_block_says_so_where_the_last_speedrun_stage_has_no_record(tmp_path):
    """A stage added since the committed run has no record yet: the try's block says so instead of the report failing.

    Seen failing (a TypeError on None) when speedrun_15 was added before the run that records it."""
    from gpt.ladder import stages_of
    from gpt.report.readme import try_output

    assert f"no committed record of {stages_of('speedrun')[-1]}" in try_output(tmp_path)


def test_the_readmes_gpu_speedrun_line_names_the_stages_its_run_did_not_finish():
    """The GPU line quotes the last stage its run trained; where later ones did not finish, it names each of them.

    Seen failing before it did (records/h200-2026-12-04 stopped at speedrun_22; speedrun_21 read as the last)."""
    from gpt.ladder import stages_of
    from gpt.report.readme import gpu_speedrun_line

    line = gpu_speedrun_line()
    trained = re.search(r"and `(speedrun_\w+)` in ", line)[1]
    later = stages_of("speedrun")[stages_of("speedrun").index(trained) + 1 :]
    if later:
        assert f"{len(later)} later stage{'s' * (len(later) > 1)} did not finish there" in line
    assert all(f"`{stage}`" in line for stage in later)


def test_the_first_findings_gain_in_tokens_a_second_is_a_range_over_the_baselines_seeds(tmp_path):
    """The faster step's gain, against each of speed_0's seeds: its one seed's rate is not a finding on its own.

    Committed time-to-loss records with their rates set: 1,200 tokens a second against 1,000, 1,100 and 900. Seen
    failing on the version that compared it with seed 3407 alone (20% more)."""
    import shutil

    from gpt.report.readme import faster_step_headline, rate_change
    from gpt.report.time_to_loss import BASELINE, LossRuns

    folder = tmp_path / "time_to_loss"
    shutil.copytree(REPO / "records" / "cpu-cpu" / "time_to_loss", folder)
    kept = LossRuns(tmp_path).kept_models()[0]
    for name, rate in ((BASELINE, 1000), (f"{BASELINE}.seed3408", 1100), (f"{BASELINE}.seed3409", 900), (kept, 1200)):
        record = json.loads((folder / f"{name}.json").read_text())
        record["metrics"]["tokens_per_s"] = rate
        (folder / f"{name}.json").write_text(json.dumps(record))
    headline = faster_step_headline(LossRuns(tmp_path))
    assert f"`{kept}` trains 9-33% more tokens a second than `{BASELINE}` (its one seed against the baseline's 3)" in (
        headline
    )
    assert rate_change(4.6, 5.4) == "5% more" and rate_change(-5.4, -1.2) == "1-5% fewer"
    assert rate_change(-3.0, 10.0) == "from 3% fewer to 10% more"


def test_the_speedrun_on_every_machine_gives_each_runs_last_held_stage_and_what_came_after_it(tmp_path):
    """A run's row: the last stage whose seeds all reached the target, and the later ones, recorded or not there.

    On a copy of records/h200-2026-12-04 (speedrun_22 failed, speedrun_23 skipped), then with speedrun_21's record
    taken out; and the project run's row agrees with the README's generated headline. Seen failing on a first
    version that called every later stage "not held there", the ones newer than a run's code among them."""
    from gpt.report.figures import speedrun_machine_row
    from gpt.report.speedrun import Speedrun

    folder = tmp_path / "h200"
    shutil.copytree(REPO / "records" / "h200-2026-12-04", folder)
    row = speedrun_machine_row(folder, Speedrun(folder))
    assert row[2] == "5eabd4b" and row[4].startswith("`speedrun_21_plain_optimizer`: 0.46 s (1 seed)")
    assert row[1] == "NVIDIA H200 (host: 16-core Intel(R) Xeon(R) Processor with AMX (family 6, model 207))"
    assert row[6] == "2 recorded, not held"
    (folder / "speedrun" / "speedrun_21_plain_optimizer.json").unlink()
    row = speedrun_machine_row(folder, Speedrun(folder))
    assert row[4].startswith("`speedrun_20_untied_head`") and row[6] == "2 recorded, not held; 1 not in its records"
    project = speedrun_machine_row(REPO / "records" / "cpu-cpu", Speedrun(REPO / "records" / "cpu-cpu"))
    headline = re.search(r"reaches it ([\d.]+)x .*?, ([\d.]+)x \(", (REPO / "README.md").read_text())
    assert project[5] == f"{headline[1]}x; {headline[2]}x whole", (project, headline.groups())


def test_a_kept_run_without_its_own_page_is_named_not_linked_to_the_projects_page(tmp_path, monkeypatch):
    """Only a default run's folder borrows the root results.md as its page; a kept run without one is named in code.

    Seen failing on the version that linked every folder under records/ without a results.md to the root's page (the
    row of records/cpu-epyc-bf16-2026-12-04-764216d, before its page was written, linked to the run of 4be151f's)."""
    import gpt.committed_records
    import gpt.report.figures
    from gpt.report.figures import speedrun_machine_row
    from gpt.report.speedrun import Speedrun

    published = tmp_path / "records"
    monkeypatch.setattr(gpt.committed_records, "PUBLISHED", published)
    monkeypatch.setattr(gpt.report.figures, "PUBLISHED", published)
    (tmp_path / "results.md").write_text("the project's page\n")
    for name in ("cpu-cpu", "cpu-epyc-kept"):
        shutil.copytree(REPO / "records" / "cpu-cpu", published / name, ignore=shutil.ignore_patterns("*.md", "plots"))
    kept = speedrun_machine_row(published / "cpu-epyc-kept", Speedrun(published / "cpu-epyc-kept"))
    assert kept[0] == f"`{published / 'cpu-epyc-kept'}`", kept[0]
    default = speedrun_machine_row(published / "cpu-cpu", Speedrun(published / "cpu-cpu"))
    assert default[0] == f"[{published / 'cpu-cpu'}]({tmp_path / 'results.md'})", default[0]


def test_a_speedrun_row_slower_than_its_parent_says_why_it_stands():
    """Slower than its parent: within speed_0's seeds' spread, kept for its tokens or its whole process, or see why.

    A stage that keeps the model is never kept for its tokens (they move in one model's last bits), and the others'
    last reason is their docstring. Seen failing on a version that compared with the parent's spread (one seed: no
    spread) instead of speed_0's, and on one that judged a stage keeping the model by its tokens (`speedrun_12` of
    the run of 2504406: "kept for its tokens", 134,836 against 135,126 on the same 44 steps)."""
    from types import SimpleNamespace

    from gpt.report.speedrun import BASELINE, slower_than_parent

    def run(seconds: dict, tokens: dict, walls: dict | None = None):
        return SimpleNamespace(
            seconds=lambda s: seconds[s],
            mean_seconds=lambda s: sum(seconds[s]) / len(seconds[s]),
            tokens=lambda s: tokens[s],
            walls=lambda s: ((walls or {}).get(s, []), "run.wall_s"),
        )

    base = {BASELINE: [100.0, 110.0, 120.0]}  # a 1.20x spread
    tokens = {"child": [90], "parent": [100]}
    assert slower_than_parent(run({**base, "child": [5.0], "parent": [6.0]}, tokens), "child", "parent") == ""
    within = slower_than_parent(run({**base, "child": [6.0], "parent": [5.5]}, tokens), "child", "parent")
    assert within == f" (slower, within the 1.20x that `{BASELINE}`'s seeds span)"
    beyond = run({**base, "child": [8.0], "parent": [5.0]}, tokens)
    assert slower_than_parent(beyond, "child", "parent") == " (slower: kept for its tokens)"
    more_tokens = run({**base, "child": [8.0], "parent": [5.0]}, {"child": [110], "parent": [100]})
    assert "docstring" in slower_than_parent(more_tokens, "child", "parent")
    shorter = run({**base, "child": [8.0], "parent": [5.0]}, tokens, {"child": [14.2], "parent": [15.0, 15.8]})
    said = " (slower: kept for its whole process, 14.2 s against 15.4)"
    assert slower_than_parent(shorter, "child", "parent", keeps_model=True) == said
    longer = run({**base, "child": [8.0], "parent": [5.0]}, tokens, {"child": [16.0], "parent": [15.4]})
    assert "docstring" in slower_than_parent(longer, "child", "parent", keeps_model=True)


def test_the_models_table_says_why_the_cpus_speed_model_is_the_larger_from_the_records():
    """The sentence under the README's models table: the CPU model's token embedding in its parameters, or nothing.

    Seen failing on a version that gave the rest of the parameters in the embedding's place."""
    from gpt.report.readme import larger_speed_model

    def record(vocab: int, width: int, params: int) -> dict:
        return {"status": "ok", "model": {"vocab_size": vocab, "n_embd": width, "params": params}}

    said = larger_speed_model(record(50257, 192, 12_307_200), record(80, 192, 2_700_000))
    assert "(50,257 x 192, shared with the output layer) holds 9.6M of its 12.3M parameters" in said
    assert larger_speed_model(record(80, 192, 2_700_000), record(80, 192, 2_700_000)) == ""
    assert larger_speed_model(record(50257, 192, 12_307_200), None) == ""


def test_the_thesis_figures_labels_cover_no_other_label_from_the_committed_records(monkeypatch, tmp_path):
    """The thesis figure's stage labels, as saved from the committed records, overlap no other label.

    Seen failing when the labels were placed before the layout shrank the axes for the legend and the y label
    ("12 eager" over "7 budget" in the run of 5659470), and when a layout after the placement moved the points."""
    from gpt.report import figures
    from gpt.report.speedrun import Speedrun
    from gpt.report.time_to_loss import LossRuns

    saved = []
    monkeypatch.setattr(
        figures, "save_figure", lambda fig, path, layout=True: (layout and fig.tight_layout(), saved.append(fig))
    )
    runs = REPO / "records" / "cpu-cpu"
    assert figures.plot_thesis(LossRuns(runs), Speedrun(runs), tmp_path / "thesis.png")
    (fig,) = saved
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = [a for a in fig.axes if a.get_xscale() == "log"]
    from matplotlib.text import Text

    # each label's own text box (an annotation's extent includes its line to the point)
    labels = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in ax.texts if t.get_text()[:1].isdigit()]
    assert len(labels) >= 17  # every stage that reaches the target, the baseline included
    crossed = [(a, b) for i, (a, box) in enumerate(labels) for b, other in labels[:i] if box.overlaps(other)]
    assert crossed == []


def test_the_records_the_readme_calls_reusable_are_those_run_all_passes_to_reuse(tmp_path, monkeypatch):
    """readme.reusable_records names, for a run folder, exactly the records run_all hands its processes' --reuse.

    run_all's planner and noise-scale calls, with a published folder to reuse from, and their commands collected:
    a record passed and not named (or named and never passed) would be said of a run wrongly or not at all."""
    from gpt import run_all
    from gpt.records import time_to_loss_dir
    from gpt.report.readme import reusable_records

    commands = []
    monkeypatch.setattr(run_all.subprocess, "Popen", lambda cmd, **k: commands.append(cmd) or mock.Mock(wait=lambda: 0))
    monkeypatch.setattr(run_all.subprocess, "call", lambda cmd, **k: commands.append(cmd) or 0)
    published, out = tmp_path / "published", tmp_path / "out"
    (out / "speedrun").mkdir(parents=True)
    for path in (p for paths in reusable_records(published).values() for p in paths):  # run_all reuses only files
        write_record(path, {})
    run_all.run_memory_planner(out, published)
    run_all.run_noise_scale(
        "smoke", "cpu", time_to_loss_dir(out, run_all.SPEEDRUN), time_to_loss_dir(published, run_all.SPEEDRUN)
    )
    passed = sorted(Path(c[c.index("--reuse") + 1]) for c in commands if "--reuse" in c)
    named = sorted(path for paths in reusable_records(published).values() for path in paths)
    assert passed == named and len(named) == 3


def test_measured_or_reused_tells_a_runs_own_records_from_those_it_took_from_records(tmp_path):
    """Each reusable record counts as the run's own unless it carries reuse_record's `reused_from` mark.

    A part with two records (the planner's) is reused where either was; a part with no record is left out."""
    from gpt.report.readme import measured_or_reused

    def written(name: str, reused: bool) -> None:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        record = {"provenance": {"computed": "2026-12-06T12:30:00+00:00"}}
        mark = {"reused_from": f"records/cpu-cpu/{name}"} if reused else {}
        (tmp_path / name).write_text(json.dumps({**record, **mark}))

    assert measured_or_reused(tmp_path) == ""
    written("speedrun/noise_scale.json", reused=False)
    written("memory_reference.json", reused=True)
    written("memory_fit.json", reused=False)
    assert measured_or_reused(tmp_path) == (
        "measured the noise-scale curve afresh and reused the planner's H100 estimates from `records/` "
        "(their code unchanged)"
    )
    written("memory_reference.json", reused=False)
    assert measured_or_reused(tmp_path) == ("measured the noise-scale curve and the planner's H100 estimates afresh")

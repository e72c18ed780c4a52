"""The memory planner (gpt/memory): estimates match the peaks real runs measure, CUDA's rules are applied,
the reference emulation keeps what it says it keeps, the fit search finds the boundary, bad input gets one
line. About a minute in all; the reference-size checks are marked slow."""
import json
import math
import subprocess
import sys
import time

import pytest
import torch

from gpt import train
from gpt.ladder import LADDERS, ladder_of, parent_of, stage_config
from gpt.memory import CUDA_ALLOCATION_UNIT, MiB, estimate
from gpt.memory.__main__ import main
from gpt.memory.planner import compare_records, largest_fit, reference_config, with_newgelu
from gpt.model import GPT

from conftest import REPO

# Smoke stages measured for real here, each compared with its estimate. Not among them:
# - speed_2_num_workers, speed_3_non_blocking: they change host-side data loading only (worker processes;
#   pinned host memory, CUDA only), so their device memory is speed_1's; running them would only cost time.
# - speed_4_compile, speed_5_amp (which keeps speed_4's compile): the planner does not simulate torch.compile
#   (it estimates the eager model) and the CPU measurement of a compiled stage runs eager under the tracker
#   too, so the check would say nothing about compilation and cost one (`compare` still lists them).
# - speed_6_ddp: DDP is estimated as its single-process rank (see gpt/memory); checked in a slow test.
# - the fast_* stages: all compiled (they continue from speed_5_amp), as speed_4 and speed_5.
# - lean_3_cpu_offload: skipped on a CPU (nothing to offload to), so there is no CPU measurement.
IN_PROCESS = ["memory_0_baseline", "memory_1_grad_accum", "memory_2_checkpointing", "memory_3_foreach_off",
              "speed_0_baseline", "speed_1_batch_size"]
TWO_PROCESSES = ["memory_4_fsdp", "lean_1_fsdp_bf16", "lean_2_chunked_loss"]
COMPILED = {"fast_1_pretokenized", "fast_2_bf16", "fast_3_sdpa", "fast_4_padded_vocab", "fast_5_fused_adamw",
            "fast_6_chunked_loss"}


def measured_record(stage: str, data_dir, out) -> dict:
    """A real smoke run of `stage` (its record): in this process, or through its script for 2 processes.
    One step per timed repeat: the peak is measured on one extra step after them, whatever their number."""
    if stage in IN_PROCESS:
        cfg = stage_config(stage, "smoke", data_dir=str(data_dir), device="cpu", warmup_iters=1, repeats=1)
        cfg.samples = cfg.batch_size
        return {"stage": stage, "ladder": ladder_of(stage), "profile": "smoke", "parent": parent_of(stage),
                **train.run(cfg, label=stage)}
    r = subprocess.run([sys.executable, str(REPO / "stages" / f"{stage}.py"), "--profile", "smoke", "--device",
                        "cpu", "--wandb", "disabled", "--data-dir", str(data_dir), "--out", str(out),
                        "--repeats", "1", "--warmup-iters", "1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads((out / f"{stage}.json").read_text())


@pytest.mark.parametrize("stage", IN_PROCESS + TWO_PROCESSES)
def test_estimate_matches_the_measured_smoke_peak(stage, char_data, tmp_path):
    record = measured_record(stage, char_data, tmp_path)
    [row] = compare_records([record], progress=lambda _: None)
    assert row["target"] == "cpu"
    assert abs(row["error_pct"]) < 5, row


def test_cuda_rules_round_every_allocation_and_keep_byte_masks():
    cfg = stage_config("memory_0_baseline", "smoke")
    cpu, cuda = estimate(cfg, 80, "cpu"), estimate(cfg, 80, "cuda")
    with torch.device("meta"):
        params = list(GPT(cpu.model).parameters())
    exact = sum(p.numel() * 4 for p in params) / MiB
    rounded = sum(math.ceil(p.numel() * 4 / CUDA_ALLOCATION_UNIT) * CUDA_ALLOCATION_UNIT for p in params) / MiB
    assert cpu.breakdown_mib["parameters"] == pytest.approx(exact, abs=0.01)
    assert cuda.breakdown_mib["parameters"] == pytest.approx(rounded, abs=0.01) and rounded > exact
    # CUDA's dropout keeps a 1-byte mask where the CPU keeps 4-byte noise: fewer activation bytes, rounding or not.
    assert cuda.breakdown_mib["activations"] < 0.9 * cpu.breakdown_mib["activations"]


def test_newgelu_keeps_three_more_mlp_wide_tensors_per_layer():
    cfg = stage_config("memory_0_baseline", "smoke")
    ours, newgelu = estimate(cfg, 80, "cpu"), estimate(cfg, 80, "cpu", adapt=with_newgelu)
    # At the forward pass's end (this stage's peak) every layer holds tanh(..), 0.5*x and 1+tanh(..) more.
    extra = cfg.n_layer * 3 * cfg.batch_size * cfg.block_size * 4 * cfg.n_embd * 4 / MiB
    assert newgelu.peak_mib - ours.peak_mib == pytest.approx(extra, rel=0.1)


def test_fit_finds_the_largest_depth_that_fits():
    budget = 4096  # MiB: a few GPT-2-large layers at the memory_0 settings
    found = largest_fit("memory_0_baseline", 1, budget, progress=lambda _: None)
    n = found["n_layer"]
    assert n >= 2 and found["peak_mib"] <= budget < found["next_peak_mib"]
    # independently of the search's own bookkeeping
    assert estimate(reference_config("memory_0_baseline", n_layer=n), 65).peak_mib <= budget
    assert estimate(reference_config("memory_0_baseline", n_layer=n + 1), 65).peak_mib > budget
    # Deep answers are extrapolated along the line through 8 and 16 layers instead: the same answer here.
    line = largest_fit("memory_0_baseline", 1, budget, progress=lambda _: None, verify_max_layers=2)
    assert line["extrapolated"] and line["n_layer"] == n and abs(line["affine_residual_mib"]) < 1
    assert line["params"] == found["params"] and line["peak_mib"] == pytest.approx(found["peak_mib"], abs=1)


@pytest.mark.parametrize("argv, message", [
    (["estimate", "--stage", "memory_9_magic"], "unknown stage"),
    (["estimate", "--n-head", "7"], "divisible"),
    (["estimate", "--stage", "memory_0_baseline", "--world-size", "2"], "runs one process"),
    (["fit", "--budget-gib", "0.5", "--world-sizes"], "below what even a 1-layer model needs"),
    (["fit", "--budget-gib", "-1"], "must be positive"),
    (["compare", "--runs", "/nonexistent/runs"], "no runs directory"),
])
def test_bad_input_gets_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_command_line_entry_point():
    r = subprocess.run([sys.executable, "-m", "gpt.memory", "estimate", "--stage", "memory_2_checkpointing",
                        "--profile", "smoke", "--vocab-size", "80"], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "predicted peak" in r.stdout and "optimizer state" in r.stdout


@pytest.mark.slow
def test_reference_baseline_estimates_in_well_under_a_minute():
    t0 = time.perf_counter()
    est = estimate(reference_config("memory_0_baseline"), 65)
    assert time.perf_counter() - t0 < 60
    assert 700e6 < est.params < 710e6  # GPT-2-large shape with 65 tokens
    b = est.breakdown_mib
    assert b["parameters"] == pytest.approx(est.params * 4 / MiB, rel=0.001)
    assert b["optimizer_state"] == pytest.approx(2 * b["parameters"], rel=0.001)  # AdamW's two moments


@pytest.mark.slow
def test_ddp_smoke_estimate_matches_its_measurement(char_data, tmp_path):
    [row] = compare_records([measured_record("speed_6_ddp", char_data, tmp_path)], progress=lambda _: None)
    assert abs(row["error_pct"]) < 5, row


def test_every_ladder_stage_is_covered_or_excused():
    excused = {"speed_2_num_workers", "speed_3_non_blocking", "speed_4_compile", "speed_5_amp", "speed_6_ddp",
               "lean_3_cpu_offload"} | COMPILED
    assert all(stage_config(s, "smoke").compile for s in COMPILED)
    assert set(IN_PROCESS + TWO_PROCESSES) | excused == {s for stages in LADDERS.values() for s in stages}

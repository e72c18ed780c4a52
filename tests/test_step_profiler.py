"""Where the time goes (gpt/step_profiler.py): the interval arithmetic, both attributions, and real profiled runs.

The interval arithmetic and both attributions (CPU, CUDA) on synthetic trace events whose breakdown is known by hand,
then real profiled runs: the profiled steps come after the timed ones and never change them, the trace opens and holds
the phases, DDP's all-reduce shows up as communication. The CUDA run itself is checked by a `gpu` test (skipped without
a GPU)."""

import json
import os
import random
import subprocess
import sys

import pytest
import torch
from conftest import REPO
from record_schema import record_problems
from test_train import tiny_config

from gpt import protocol, step_profiler, train
from gpt.step_profiler import attribute, breakdown, intersect, length, subtract, union

# ---------------------------------------------------------------------------------------------------------
# interval arithmetic


def test_union_intersect_subtract():
    assert union([(5, 7), (0, 2), (1, 3), (4, 4), (7, 8)]) == [(0, 3), (5, 8)]  # empty (4, 4) dropped
    a, b = [(0, 3), (5, 8)], [(2, 6), (7, 9)]
    assert intersect(a, b) == [(2, 3), (5, 6), (7, 8)]
    assert subtract(a, b) == [(0, 2), (6, 7)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert length(a) == 6


def test_attribute_matches_a_brute_force_count_on_random_intervals():
    """Each unit of time goes to the first layer that covers it, else to `rest`: counted unit by unit."""
    rng = random.Random(0)
    for _ in range(200):
        window = (rng.randint(0, 20), rng.randint(30, 60))
        layers = [
            (rng.choice("abc"), [tuple(sorted(rng.sample(range(70), 2))) for _ in range(rng.randint(0, 4))])
            for _ in range(rng.randint(0, 5))
        ]
        expected = {}
        for t in range(*window):
            owner = next((c for c, spans in layers if any(s <= t < e for s, e in spans)), "rest")
            expected[owner] = expected.get(owner, 0) + 1
        got = {c: v for c, v in attribute([window], layers, "rest").items() if v}
        assert got == expected
        assert sum(attribute([window], layers, "rest").values()) == window[1] - window[0]


# ---------------------------------------------------------------------------------------------------------
# attribution of synthetic traces (Kineto's Chrome trace format; times in microseconds)


def span(name, ts, dur, tid=1, cat="user_annotation", pid=7, **args):
    event = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    return {**event, "args": args} if args else event


def phases(**ranges):
    return [span(step_profiler.PREFIX + name, s, e - s) for name, (s, e) in ranges.items()]


def test_cpu_breakdown_by_phase_with_exposed_communication():
    events = [
        span(step_profiler.STEP, 0, 100),
        *phases(data=(0, 10), copy=(10, 12), forward=(12, 40), backward=(40, 80), optimizer=(80, 95)),
        span("aten::mm", 14, 24, cat="cpu_op"),  # forward: an operator, then Python around it (still forward)
        span("autograd::engine::evaluate_function: MmBackward0", 40, 20, cat="cpu_op"),
        span("c10d::allreduce_", 60, 1, cat="cpu_op"),  # issuing the all-reduce: communication
        span("gloo:all_reduce", 61, 14, tid=2),  # runs on gloo's thread from 61 to 75
        span("aten::add_", 70, 10, cat="cpu_op"),  # the thread computes again from 70: overlap, not a wait
        span("gloo:all_reduce", 82, 5, tid=2),  # in flight during the optimizer, but the thread is
        span("Optimizer.step#AdamW.step", 80, 15),  # inside a range: it is not waiting for it
        span("aten::mm", 120, 10, cat="cpu_op"),  # outside the profiled steps
    ]
    b = breakdown(events)
    assert b["steps"] == 1 and b["step_s"] == pytest.approx(100e-6) and b["gpu_idle_pct"] is None
    assert b["shares_pct"] == pytest.approx(
        {"data": 10, "copy": 2, "forward": 28, "backward": 30, "optimizer": 15, "communication": 10, "other": 5}
    )


def test_cuda_breakdown_by_what_the_gpu_was_doing():
    gpu = dict(pid=0, tid=7)  # device 0, stream 7
    events = [
        span(step_profiler.STEP, 0, 100),
        *phases(data=(0, 10), copy=(10, 12), forward=(12, 30), backward=(30, 60), optimizer=(60, 70)),
        span("cudaMemcpyAsync", 10.5, 0.5, cat="cuda_runtime", correlation=1),
        span("Memcpy HtoD (Pageable -> Device)", 11, 1, cat="gpu_memcpy", correlation=1, **gpu),
        span("cudaLaunchKernel", 13, 1, cat="cuda_runtime", correlation=2),
        span("cudaGraphLaunch", 14, 1, cat="cuda_runtime", correlation=3),
        span("ampere_sgemm", 15, 20, cat="kernel", correlation=2, **gpu),  # forward, running late
        span("triton_fused", 35, 10, cat="kernel", correlation=3, **gpu),  # a graph replay's kernel: forward
        span("cuLaunchKernel", 31, 1, cat="cuda_driver", tid=3, correlation=4),  # autograd's thread
        span("sgemm_backward", 45, 35, cat="kernel", correlation=4, **gpu),
        span("cudaLaunchKernel", 50, 1, cat="cuda_runtime", tid=3, correlation=5),
        span("ncclDevKernel_AllReduce_Sum_f32", 70, 20, cat="kernel", correlation=5, pid=0, tid=9),
        span("cudaLaunchKernel", 61, 1, cat="cuda_runtime", correlation=6),
        span("multi_tensor_apply_kernel", 90, 5, cat="kernel", correlation=6, **gpu),
        span("mystery_kernel", 96, 1, cat="kernel", correlation=99, **gpu),  # launch not in the trace
        # Kineto repeats the host's ranges on the GPU's timeline: they are not the host's, nor GPU work
        span(step_profiler.STEP, 5, 100, cat="gpu_user_annotation", **gpu),
        span("ladder/forward", 15, 30, cat="gpu_user_annotation", **gpu),
    ]
    b = breakdown(events)
    # GPU idle from 0 to 11: the host fetched data (to 10), then copied; 12-15: the host was launching
    # forward's kernels; the NCCL kernel overlaps backward's until 80, exposed from 80 to 90.
    assert b["shares_pct"] == pytest.approx(
        {
            "data": 10,
            "copy": 2,
            "forward": 30,
            "backward": 35,
            "optimizer": 5,
            "communication": 10,
            "gpu_idle": 7,
            "other": 1,
        }
    )
    assert b["gpu_idle_pct"] == pytest.approx(11 + 3 + 4)  # no GPU activity at all: 0-11, 12-15, 95-96, 97-100


def test_a_trace_without_profiled_steps_is_an_error():
    with pytest.raises(ValueError, match="no 'ladder/step' ranges"):
        breakdown([span("aten::mm", 0, 1, cat="cpu_op")])


def test_phase_labels_exist_only_while_a_profiler_runs():
    assert step_profiler.step_phase("forward") is step_profiler.step_phase("backward")  # the shared no-op: no cost
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert isinstance(step_profiler.step_phase("forward"), torch.profiler.record_function)


# ---------------------------------------------------------------------------------------------------------
# real profiled runs on the CPU


def test_profiled_steps_come_after_the_timed_ones_and_never_change_them(char_data, tmp_path, monkeypatch):
    """The profiled steps come after the timed ones and never change them.

    Same seed, with and without profiling: the timed losses are bit-identical (the profiled steps come after them), no
    timed step runs under the profiler, and only the profiled run writes a trace."""
    profiled_calls = []
    real_train_step = train.train_step

    def watched(*args, **kwargs):
        profiled_calls.append(torch.autograd._profiler_enabled())
        return real_train_step(*args, **kwargs)

    monkeypatch.setattr(train, "train_step", watched)
    cfg = dict(samples=24, repeats=2, dropout=0.1)  # 3 steps per repeat; dropout: the RNG stream must match
    trace = tmp_path / "new_dir" / "stage.trace.json.gz"  # its directory does not exist yet
    plain = protocol.run(tiny_config(char_data, profile_steps=0, **cfg), trace_path=tmp_path / "plain.trace.json.gz")
    assert profiled_calls == [False] * (1 + 6 + 1)  # warm-up, timed, memory
    profiled_calls.clear()
    profiled = protocol.run(tiny_config(char_data, profile_steps=2, **cfg), trace_path=trace)
    assert profiled_calls == [False] * (1 + 6) + [True] * 2 + [False]  # profiled after timing, before memory

    m, p = profiled["metrics"], plain["metrics"]
    assert m["losses"] == p["losses"] and m["loss_first"] == p["loss_first"]
    assert p["time_breakdown_pct"] is None and p["profiler"] is None
    assert not (tmp_path / "plain.trace.json.gz").exists()
    shares = m["time_breakdown_pct"]
    assert sum(shares.values()) == pytest.approx(100) and "gpu_idle" not in shares
    assert all(shares[c] > 0 for c in ("data", "forward", "backward", "optimizer"))
    assert m["profiler"]["steps"] == 2 and m["profiler"]["trace"] == trace.name and m["profiler"]["rank"] == 0
    events = step_profiler.read_trace(trace)  # gzipped Chrome trace JSON, as Perfetto opens it
    names = [e.get("name") for e in events]
    assert names.count(step_profiler.STEP) == 2 and names.count("ladder/forward") == 2
    assert 0 <= m["copy_pct"] < m["data_wait_pct"] + 1  # on the CPU the "copy" is a no-op .to("cpu")
    record = {**profiled, "stage": "t", "ladder": "speed", "profile": "test", "parent": None}
    assert record_problems(record) == []


def run_stage(stage, out, *args, env=None):
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "stages" / f"{stage}.py"),
            "--profile",
            "smoke",
            "--wandb",
            "disabled",
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


@pytest.mark.slow  # two gloo ranks and a profiler trace: 8 s; the default suite stays under 10 min on 2 cores
def test_ddp_all_reduce_is_communication_and_rank_0_writes_the_trace(char_data, tmp_path):
    # Dynamo off: each rank's cold inductor compile took ~45 s of this test; the claim is the profiler's, not compile's
    env = {**os.environ, "TORCHDYNAMO_DISABLE": "1"}
    r = run_stage("speed_6_ddp", tmp_path / "out", "--data-dir", str(char_data), "--device", "cpu", env=env)  # gloo
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads((tmp_path / "out" / "speed_6_ddp.json").read_text())
    shares = record["metrics"]["time_breakdown_pct"]
    assert shares["communication"] > 0 and sum(shares.values()) == pytest.approx(100)
    assert record["metrics"]["profiler"]["rank"] == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["speed_6_ddp.json", "speed_6_ddp.trace.json.gz"]
    events = step_profiler.read_trace(tmp_path / "out" / "speed_6_ddp.trace.json.gz")
    assert any(str(e.get("name")).startswith("gloo:all_reduce") for e in events)
    assert "where the time goes (2 profiled steps)" in r.stdout


def test_no_profiler_flag_skips_the_profiled_steps(char_data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "memory_0_baseline.trace.json.gz").write_text("a stale trace from an earlier run")
    r = run_stage("memory_0_baseline", out, "--data-dir", str(char_data), "--no-profiler")
    assert r.returncode == 0, r.stderr[-3000:]
    record = json.loads((out / "memory_0_baseline.json").read_text())
    assert record["config"]["profile_steps"] == 0 and record["metrics"]["time_breakdown_pct"] is None
    assert not (out / "memory_0_baseline.trace.json.gz").exists()
    assert "where the time goes" not in r.stdout


# ---------------------------------------------------------------------------------------------------------
# on a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compile_", [False, True], ids=["eager", "cuda-graphs"])
def test_cuda_breakdown_sees_kernels_and_gpu_idle(char_data, tmp_path, compile_):
    """On the GPU the breakdown comes from kernels, attributed to the phases.

    The kernels must be in the trace (with CUDA graphs too, whose kernels are replayed from one launch), attributed to
    the phases, and the copy timed with CUDA events."""
    cfg = tiny_config(
        char_data, device="cuda", samples=32, repeats=2, compile=compile_, profile_steps=3, measure_memory=False
    )
    m = protocol.run(cfg, trace_path=tmp_path / "t.trace.json.gz")["metrics"]
    shares = m["time_breakdown_pct"]
    assert sum(shares.values()) == pytest.approx(100) and "gpu_idle" in shares
    assert shares["forward"] > 0 and shares["backward"] > 0 and shares["optimizer"] > 0
    assert 0 <= m["profiler"]["gpu_idle_pct"] < 100
    assert m["profiler"]["gpu_idle_pct"] >= shares["gpu_idle"] - 1e-6  # all idle time vs the unexplained part
    events = step_profiler.read_trace(tmp_path / "t.trace.json.gz")
    assert any(e.get("cat") == "kernel" for e in events)
    assert m["copy_pct"] > 0

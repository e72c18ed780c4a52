"""The trainer: it learns, it is deterministic, it writes a valid record, and bad input gets one line."""

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import REPO
from record_schema import record_problems

from gpt import clocks, protocol, run_choices, train
from gpt.config import TrainConfig
from gpt.optimizations import compilation

TINY = dict(
    preset="gpt-mini",
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=32,
    dropout=0.0,
    dataset="tokens",
    batch_size=8,
    warmup_iters=1,
    device="cpu",
)


def tiny_config(data_dir, **overrides) -> TrainConfig:
    return TrainConfig(**{**TINY, "data_dir": str(data_dir), **overrides})


def test_short_cpu_run_lowers_the_loss_and_returns_a_valid_record(char_data):
    cfg = tiny_config(char_data, samples=8 * 20, repeats=2, lr=3e-3)  # 1 + 40 steps
    record = protocol.run(cfg, label="test")
    record.update(stage="test", ladder="speed", profile="test", parent=None)
    assert record_problems(record) == []
    m = record["metrics"]
    assert len(m["losses"]) == 40 and len(m["seconds_per_repeat"]) == 2
    # Untrained, the loss is ln(vocab) ~ 4.1; after 40 steps at lr 3e-3 a char model is well below it.
    assert m["loss_first"] == pytest.approx(np.log(record["model"]["vocab_size"]), abs=0.3)
    assert np.mean(m["losses"][-10:]) < m["loss_first"] - 0.5
    assert m["peak_memory_mib"] > 0 and m["memory_breakdown_mib"]["parameters"] > 0
    assert m["tokens_per_s"] == pytest.approx(cfg.samples * cfg.block_size / m["seconds_mean"])
    json.dumps(record)  # serialisable as is


def test_cpu_memory_step_is_the_last_warm_up_step_when_there_are_two(char_data, monkeypatch):
    """With two warm-up steps the second is the CPU's memory step, with no extra step after timing.

    It measures what an extra step after timing measures: the same breakdown; the steps taken are one fewer, and the
    training itself (losses) is unchanged."""
    steps = []
    step = train.train_step
    monkeypatch.setattr(train, "train_step", lambda *a: steps.append(1) or step(*a))
    cfg = dict(samples=16, repeats=1, profile_steps=0)
    folded = protocol.run(tiny_config(char_data, warmup_iters=2, **cfg))["metrics"]
    n_folded, steps[:] = len(steps), []
    extra = protocol.run(tiny_config(char_data, warmup_iters=2, measure_memory=False, **cfg))["metrics"]
    assert len(steps) == n_folded == 2 + 2  # warm-up 2 (one tracked) + one repeat of 2 steps
    assert folded["losses"] == extra["losses"]
    steps[:] = []
    single = protocol.run(tiny_config(char_data, warmup_iters=1, **cfg))["metrics"]
    assert len(steps) == 1 + 2 + 1  # one warm-up step: the memory step comes after timing
    assert folded["memory_breakdown_mib"] == single["memory_breakdown_mib"]
    assert folded["peak_memory_mib"] == single["peak_memory_mib"] > 0


# What the allocator's history of speed_4_compile's memory step gave on an H100 (records/h100-2026-11-24): a CUDA
# graph replay allocates nothing, so only the step's eager rest was traced, 42 of the 3,992 MiB the stage reserved.
H100_GRAPH_REPLAY = {
    "breakdown_mib": {
        "parameters": 10.35,
        "buffers": 0.09,
        "gradients": 0.0,
        "optimizer_state": 20.69,
        "activations": 0.0,
        "temporaries": 10.68,
        "other": 0.02,
        "total": 41.84,
    },
    "timeline_mib": [31.1, 41.84, 31.1],
    "snapshot": "speed_4_compile.memory.pickle",
}


@pytest.mark.parametrize("cuda_graphs", [True, False])
def test_a_cuda_graph_stage_records_no_breakdown_of_a_replay_the_allocator_did_not_see(cuda_graphs, monkeypatch):
    """A CUDA-graph stage records no memory breakdown, as its replay runs unseen by the allocator.

    The CUDA memory step is traced by the caching allocator's history; a CUDA-graph replay runs in the graphs' private
    pool without asking the allocator, so the trace holds neither activations nor gradients. Such a stage records no
    breakdown and no curve (null) rather than that one (d44d90b recorded it); its snapshot is kept, and an eager stage's
    breakdown is unchanged."""
    from types import SimpleNamespace

    monkeypatch.setattr(protocol, "cuda_step_memory", lambda *a: {**H100_GRAPH_REPLAY})
    trainer = SimpleNamespace(
        cfg=TrainConfig(measure_memory=True),
        device=torch.device("cuda", 0),
        rank=0,
        cuda_graphs=cuda_graphs,
        step=None,
        model=None,
        gpt=None,
        optimizer=None,
    )
    memory = protocol.memory_step(trainer, None)
    assert memory["snapshot"] == H100_GRAPH_REPLAY["snapshot"]
    if cuda_graphs:
        assert memory["breakdown_mib"] is None and memory["timeline_mib"] is None
    else:
        assert memory == H100_GRAPH_REPLAY


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # inside torch's inductor import
def test_a_compiled_model_stays_compiled_after_the_memory_step(char_data, traced_not_compiled):
    """A compiled model stays compiled after the memory step.

    The memory step (here the last warm-up step) runs under MemTracker's dispatch mode, which dynamo cannot trace;
    without care dynamo marks the model's frame "skip" there and every timed step after it runs eager, silently (no
    recompilation). The profiled step after timing must still run the compiled graphs."""
    cfg = dict(warmup_iters=2, samples=16, repeats=1, profile_steps=1)
    record = protocol.run(tiny_config(char_data, compile=True, **cfg))
    assert record["metrics"]["memory_breakdown_mib"]["total"] > 0  # the tracked warm-up step happened
    assert record["metrics"]["profiler"]["compiled_regions_per_step"] >= 1
    # negative control: the same count is 0 for an eager model
    assert protocol.run(tiny_config(char_data, **cfg))["metrics"]["profiler"]["compiled_regions_per_step"] == 0


def test_cpu_training_is_deterministic(char_data):
    cfg = tiny_config(char_data, samples=16, repeats=1, dropout=0.1, measure_memory=False)
    a, b = protocol.run(cfg)["metrics"]["losses"], protocol.run(cfg)["metrics"]["losses"]
    assert a == b  # bit-identical on the CPU for the same seed


def test_a_run_whose_choices_were_measured_trains_as_one_that_found_them_cached(char_data, tmp_path, monkeypatch):
    """The run's choices time kernels on random inputs: with an empty machine cache they measure, with a full one not.

    Two runs with dropout and bf16 autocast, whose rule times matmuls once the model is seeded (the explicit attention
    asks it nothing before), the first measuring into an empty cache, the second reading it: the same losses, to the
    bit. Seen failing with matmul_rate's fork_rng taken out (the speed_6_ddp of the runs of 2504406 and be500b7)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing measured before
    cfg = tiny_config(char_data, samples=16, repeats=1, dropout=0.1, measure_memory=False, amp=True)
    measured = protocol.run(cfg)
    assert "measured matmul rates" in measured["choices"]["amp_why"]
    cached = protocol.run(cfg)
    assert measured["metrics"]["loss_first"] == cached["metrics"]["loss_first"]
    assert measured["metrics"]["losses"] == cached["metrics"]["losses"]


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # inside torch's inductor import
def test_step_loop_with_cuda_graph_bookkeeping_runs_on_the_cpu(char_data, traced_not_compiled, monkeypatch):
    """The step loop's CUDA-graph bookkeeping runs on the CPU and trains as eager training does.

    The CUDA path of the step loop (compile mode "reduce-overhead": a cudagraph_mark_step_begin before every step, the
    loss cloned out of the graph's memory) forced on the CPU, where reduce-overhead compiles without CUDA graphs. Every
    step marks its beginning; the losses are those of eager training within test_compile_matches_eager's tolerance."""
    marks = []
    mark = torch.compiler.cudagraph_mark_step_begin
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1) or mark())
    reduce_overhead = lambda cfg, device: ("reduce-overhead" if cfg.compile else None, None)  # noqa: E731
    monkeypatch.setattr(compilation, "compile_choice", reduce_overhead)  # build_model asks it through compile_mode
    monkeypatch.setattr(run_choices, "compile_choice", reduce_overhead)  # the run's choices ask it once
    cfg = dict(samples=16, repeats=2, warmup_iters=2, measure_memory=False)
    eager = protocol.run(tiny_config(char_data, **cfg))["metrics"]["losses"]
    assert marks == []
    record = protocol.run(tiny_config(char_data, compile=True, **cfg))
    assert record["choices"]["compile_mode"] == "reduce-overhead"
    profiled = record["metrics"]["profiler"]["steps"]  # the profiled steps after timing are steps too
    assert profiled >= 1 and len(marks) == 2 + 2 * 2 + profiled  # + warm-up, repeats x steps (16 samples / 8)
    assert record["metrics"]["losses"] == pytest.approx(eager, rel=1e-5)


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_recording_the_cuda_graphs_counts_in_compile_s(cuda_graphs, char_data, monkeypatch):
    """Recording the CUDA graphs counts in compile_s, as the first step's compilation does, not in a timed step.

    The timed protocol's twin of tests/test_time_to_loss.py:test_recording_the_cuda_graphs_is_start_up_not_training, on
    a clock of the steps' own making (10 s, 5 s, 3 s, then 1 s each): under CUDA graphs (the run's choice forced on the
    CPU, the model left eager) compile_s is what the first three steps took beyond a steady step, 9 + 4 + 2 s; in the
    default mode, the first step's 9 s."""
    mode = "reduce-overhead" if cuda_graphs else "default"
    monkeypatch.setattr(run_choices, "compile_choice", lambda cfg, device: (mode, None))  # the run's choices only
    now = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: now[0])
    monkeypatch.setattr(protocol, "time", clock)
    monkeypatch.setattr(clocks, "time", clock)  # the timed steps' own clock on the CPU
    step = train.Trainer.step

    def timed_step(self, feed=None):
        now[0] += {0: 10.0, 1: 5.0, 2: 3.0}.get(self.steps_done, 1.0)
        return step(self, feed)

    monkeypatch.setattr(train.Trainer, "step", timed_step)
    cfg = tiny_config(char_data, samples=16, repeats=2, warmup_iters=4, measure_memory=False, profile_steps=0)
    m = protocol.run(cfg)["metrics"]
    assert m["step_times_s"] == [1.0] * 4 and m["first_step_s"] == 10.0
    assert m["compile_s"] == pytest.approx(9.0 + 4.0 + 2.0 if cuda_graphs else 9.0)


def run_stage(*args, stage="speed_0_baseline"):
    return subprocess.run(
        [sys.executable, str(REPO / "stages" / f"{stage}.py"), "--wandb", "disabled", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_stage_script_writes_a_valid_record_and_a_summary(tmp_path, char_data):
    r = run_stage("--profile", "smoke", "--data-dir", str(char_data), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "speed_0_baseline.json").read_text())
    assert record_problems(record) == []
    assert record["stage"] == "speed_0_baseline" and record["profile"] == "smoke"
    assert "tokens/s" in r.stdout and "peak memory" in r.stdout


def make_bad_vocab_data(tmp_path, char_data):
    """A prepared data set whose meta claims a vocabulary smaller than its token ids."""
    bad = tmp_path / "bad_vocab"
    bad.mkdir()
    for f in char_data.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    meta = json.loads((bad / "meta.json").read_text())
    meta["vocab_size"] = 10
    meta["tokenizer"]["chars"] = meta["tokenizer"]["chars"][:10]
    (bad / "meta.json").write_text(json.dumps(meta))
    return bad


def assert_one_line_error(r, expected):
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--preset", "gpt5"], "unknown model preset"),
        (["--batch-size", "0"], "batch size must be >= 1"),
        (["--block-size", "2048"], "block size 2048"),
        (["--data-dir", "/nonexistent/data"], "python data/prepare.py"),
    ],
)
def test_bad_input_gets_one_line_and_exit_2(tmp_path, char_data, args, expected):
    r = run_stage("--profile", "smoke", "--data-dir", str(char_data), *args, "--out", str(tmp_path))
    assert_one_line_error(r, expected)


def test_unknown_profile_gets_one_line(tmp_path):
    assert_one_line_error(run_stage("--profile", "huge", "--out", str(tmp_path)), "unknown profile")


def test_token_ids_beyond_the_vocabulary_get_one_line(tmp_path, char_data):
    bad = make_bad_vocab_data(tmp_path, char_data)
    r = run_stage("--profile", "smoke", "--data-dir", str(bad), "--out", str(tmp_path), stage="memory_0_baseline")
    assert_one_line_error(r, ">= vocab size")  # memory_0 reads the token file, which checks the ids

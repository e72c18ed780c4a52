"""The GPU suite: what the CPU tests cannot check, on the user's hardware.

Run it once on a GPU machine before the ladder:

    .venv/bin/python -m pytest -m gpu

Every test here is marked `gpu` and skipped without CUDA (tests/conftest.py); the distributed ones also need 2 GPUs;
those marked `quick` are the subset `./run_all.sh --quick` runs first on a GPU (at most 90 s: gpt/quick_run.py). CI
has no GPU. They ran on one H100 (torch 2.11, 2026-11-26): every one-GPU test passed; the 2-GPU ones have not run
anywhere yet, and their bounds, marked "not yet measured", are estimates. The speedrun's tests at the end (Muon's bf16
Newton-Schulz, the last stage with its CUDA graphs and its schedule, the noise scale) were added later and have not run
on a GPU yet; their CPU twins run in the CPU suite. So have the runs of 2 ranks sharing one GPU over gloo.
"""

import os
import pickle
import re
import subprocess
import sys
from dataclasses import fields

import pytest
import torch
from conftest import smoke_stage_argv
from equivalence import max_diff, tiny_config
from record_schema import record_problems
from test_checkpointing import with_pytorchs_early_stop
from test_chunked_loss import BF16_CHUNKED_WEIGHT_GRAD
from test_muon import check_a_bf16_muon_step_matches_fp32_on_the_cpu, check_newton_schulz_in_bf16
from test_noise_scale import check_smoke_measurement, measure_smoke
from test_parallel import check_two_processes_match_one
from test_plain_optimizer import check_plain_steps_equal_torchs
from test_precision import check_fp16_tracks_fp32
from test_report import details
from test_speedrun import check_the_groups_follow_wsd, check_the_last_stage_learns_compiled, trace_last_stage
from test_time_to_loss import LEARNING_STAGES, learning_budget
from test_train import run_stage

from gpt import protocol, time_to_loss, train
from gpt.allocator_snapshot import MiB
from gpt.data import GatheredBatches, WindowSampler, make_dataset
from gpt.ladder import STAGES_DIR, stage_config, stages_of
from gpt.model import GPT, GPTConfig
from gpt.optimizations import chunked_loss
from gpt.optimizations.feeding import make_loader, to_device
from gpt.optimizations.precision import mixed_precision
from gpt.peak_memory import traced_memory
from gpt.records import read_record, record_path, write_record
from gpt.report.document import write_report

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
# The quick run's subset (`pytest -m "gpu and quick"`, gpt/quick_run.py): the checks that start no stage process,
# compile nothing and train nothing to a loss, since the quick run's own stages do those on the GPU.
quick = pytest.mark.quick

# The 2-GPU runs against one GPU, as on the CPU (tests/optimizations/test_parallel.py), with bounds 10x the CPU's
# (not yet measured): GPU kernels reduce in other orders than the CPU's, and cuBLAS picks other algorithms for a
# batch of 4 than for 8. A wrong batch or a missing all-reduce moves the weights by ~lr (5e-4), far beyond them.
GPU_DIST_GRAD_TOL = (1e-4, 1e-6)  # (rtol, atol)
GPU_DIST_PARAM_TOL = (1e-4, 1e-5)


def cuda_run(char_data, tmp_path, **overrides) -> tuple[dict, dict]:
    """A short single-GPU run through protocol.run: (its record, the allocator snapshot it wrote)."""
    cfg = tiny_config(char_data, device="cuda", samples=32, repeats=2, warmup_iters=3, measure_memory=True, **overrides)
    path = tmp_path / "stage.memory.pickle"
    record = protocol.run(cfg, memory_snapshot=path)
    with open(path, "rb") as f:
        return record, pickle.load(f)


@quick
def test_eager_stage_peak_equals_what_the_allocator_snapshot_shows(char_data, tmp_path):
    """The record's peak is the traced step's peak, and the breakdown's parameters and AdamW state are their blocks.

    The record's peak is max_memory_allocated over the timed repeats; the traced step is one more step like them (within
    1%: the trace cannot show a block the allocator left unsplit, larger than its request; this model's blocks are all
    small). The blocks are counted with 512-byte rounding."""
    record, snapshot = cuda_run(char_data, tmp_path)
    m = record["metrics"]
    assert record["choices"]["memory_method"] == "cuda_max_allocated"
    assert m["peak_memory_mib"] == m["peak_memory_allocated_mib"] <= m["peak_memory_reserved_mib"]
    timeline = traced_memory(snapshot, 0).timeline
    assert max(timeline) / MiB == pytest.approx(m["peak_memory_mib"], rel=0.01)
    assert m["memory_breakdown_mib"]["total"] == pytest.approx(max(timeline) / MiB, abs=0.01)
    assert max(m["memory_timeline_mib"]) == pytest.approx(max(timeline) / MiB, abs=0.01)
    with torch.device("meta"):
        model = GPT(GPTConfig(**{f.name: record["model"][f.name] for f in fields(GPTConfig)}))
    params = sum(-(-p.numel() * p.element_size() // 512) * 512 for p in model.parameters())
    assert m["memory_breakdown_mib"]["parameters"] == pytest.approx(params / MiB, abs=0.01)
    assert m["memory_breakdown_mib"]["optimizer_state"] == pytest.approx(2 * params / MiB, abs=0.01)  # AdamW


def test_cuda_graph_stage_reports_what_its_graphs_hold(char_data, tmp_path):
    """A stage with CUDA graphs reports the allocator's reservation as its peak, and no breakdown.

    A compiled stage runs CUDA graphs ("reduce-overhead"): its peak is the allocator's reservation, which holds the
    graphs' private pool; beside its eager parent, the report compares the two on reserved memory and says so. Its
    memory step is a replay, which the allocator's history does not see (the CPU test tests/test_train.py holds the
    record's side; this, that the trace really misses the pool): no breakdown."""
    eager, _ = cuda_run(char_data, tmp_path / "eager")
    graphs, snapshot = cuda_run(char_data, tmp_path / "graphs", compile=True)
    m = graphs["metrics"]
    assert graphs["choices"]["compile_mode"] == "reduce-overhead"
    assert graphs["choices"]["memory_method"] == "cuda_max_reserved"
    assert m["peak_memory_mib"] == m["peak_memory_reserved_mib"] >= m["peak_memory_allocated_mib"]
    pool = sum(s["total_size"] for s in snapshot["segments"] if tuple(s["segment_pool_id"]) != (0, 0))
    assert pool > 0  # the graphs really were recorded into a private pool
    assert m["peak_memory_mib"] * MiB >= pool
    assert traced_memory(snapshot, 0).peak_mib * MiB < pool  # the replay's trace: the step's eager rest only
    assert m["memory_breakdown_mib"] is None and m["memory_timeline_mib"] is None and m["memory_snapshot"]

    out = tmp_path / "records"
    for stage, record in (("speed_3_non_blocking", eager), ("speed_4_compile", graphs)):
        write_record(
            record_path(out, stage), {**record, "stage": stage, "ladder": "speed", "profile": "test", "parent": None}
        )
    md = write_report(out).read_text()
    assert details(md, "speed_4_compile")[1].endswith("†")  # the "MiB vs prev." cell
    assert "their change compares the max_memory_reserved of both" in md

    # the peak that holds the pool, for the planner's compare: the graphs were recorded during warm-up
    from gpt.memory.planner import compared_peak

    warm = m["peak_memory_warmup_allocated_mib"]
    assert warm >= m["peak_memory_allocated_mib"]
    assert warm >= 0.5 * eager["metrics"]["peak_memory_allocated_mib"]  # the pool holds a step's activations
    assert compared_peak(graphs) == (warm, "max_memory_allocated over warm-up (graph pool in)")


@two_gpus
@pytest.mark.parametrize(
    "mode, stage_settings",
    [
        ("ddp", dict(grad_accum_steps=2)),
        ("fsdp", dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False)),
    ],
)
def test_two_gpus_match_one_gpu_on_the_combined_batch(mode, stage_settings, char_data, tmp_path):
    check_two_processes_match_one(
        mode, stage_settings, char_data, tmp_path, "cuda", GPU_DIST_GRAD_TOL, GPU_DIST_PARAM_TOL
    )


@two_gpus
def test_two_gpus_with_cpu_offload_match_one_gpu(char_data, tmp_path):
    """lean_3 on 2 GPUs with CPU offload matches one GPU: the offload where it does something.

    The CPU suite runs the same comparison on 2 gloo processes
    (tests/optimizations/test_parallel.py:test_cpu_offload_on_two_processes_matches_one_process), but there the shards
    are copied host to host, unpinned (a CPU-only torch has no pinned memory): only here do they go to pinned host
    memory and back to the GPU around each all-gather, the gradients to the host, and AdamW step on host shards while
    the model computes on the GPU (with host collectives beside NCCL: gpt/distributed.py:backend_for)."""
    from test_parallel import LEAN_3

    check_two_processes_match_one("fsdp", LEAN_3, char_data, tmp_path, "cuda", GPU_DIST_GRAD_TOL, GPU_DIST_PARAM_TOL)


# ---- 2 ranks sharing one GPU over gloo ---------------------------------------------------------------------------

# speed_6 (DDP), memory_4 (FSDP) and lean_1 (FSDP with bf16 parameters) as 2 ranks on one GPU (tests/dist_worker.py
# --one-gpu), against one process on the same GPU: what a one-GPU machine can check of them. Gloo's collectives on CUDA
# tensors copy them to the host and reduce there in fp32 (for 2 ranks a + b, in either order the same), so the bounds
# are those of 2 GPUs over NCCL (GPU_DIST_*: cuBLAS's other algorithms for a batch of 4 than for 8); lean_1's losses
# are bf16's against fp32's, within test_parallel.py's FSDP_BF16_LOSS_ATOL (derived there).
GLOO_LACKS = re.compile(r"does not support (\w+)")


def on_one_gpu(check) -> None:
    """Run `check`; where gloo lacks a collective for CUDA tensors, say which and let the CPU run stand in.

    The CPU-tensor path of the same stage (tests/optimizations/test_parallel.py, 2 gloo processes on the CPU) then
    holds the arithmetic; only the copies between the GPU and gloo go unchecked."""
    try:
        check()
    except AssertionError as failed:
        if missing := GLOO_LACKS.search(str(failed)):
            pytest.xfail(f"gloo has no {missing.group(1)} for CUDA tensors: test_parallel.py's CPU run stands in")
        raise


@pytest.mark.parametrize(
    "mode, stage_settings",
    [
        ("ddp", dict(grad_accum_steps=2)),
        ("fsdp", dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False)),
    ],
)
def test_two_ranks_sharing_one_gpu_over_gloo_match_one_process(mode, stage_settings, char_data, tmp_path):
    """speed_6 (DDP) and memory_4 (FSDP) as 2 ranks on one GPU over gloo match one process on the combined batch.

    Losses, every step's gradients and the final parameters, as the CPU and the 2-GPU runs are compared. NCCL stays
    untested here: a one-GPU machine cannot give each rank the GPU of its own NCCL wants."""
    on_one_gpu(
        lambda: check_two_processes_match_one(
            mode, stage_settings, char_data, tmp_path, "cuda", GPU_DIST_GRAD_TOL, GPU_DIST_PARAM_TOL, ("--one-gpu",)
        )
    )


def test_lean_1_as_two_ranks_sharing_one_gpu_over_gloo_tracks_fp32_on_one_process(char_data, tmp_path):
    """lean_1 (FSDP with bf16 parameters, an fp32 reduction) as 2 ranks on one GPU over gloo tracks fp32's losses.

    Its losses against one fp32 process on the same GPU, within bf16's bound (FSDP_BF16_LOSS_ATOL). NCCL stays untested
    here (one GPU)."""
    from equivalence import train_with_grads
    from test_parallel import DIST_STEPS, FSDP_BF16_LOSS_ATOL, NPROC, RANK_BATCH, launch_workers

    memory_4 = dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False)
    cfg = tiny_config(
        char_data,
        distributed="fsdp",
        nproc=NPROC,
        batch_size=RANK_BATCH,
        device="cuda",
        goal="memory",
        fsdp_mixed_precision=True,
        **memory_4,
    )
    on_one_gpu(lambda: launch_workers(cfg, DIST_STEPS, tmp_path, "--one-gpu"))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(NPROC)]
    single = train_with_grads(tiny_config(char_data, batch_size=NPROC * RANK_BATCH, device="cuda"), DIST_STEPS)[0]
    rank_mean = [sum(losses) / NPROC for losses in zip(*(r["losses"] for r in ranks))]
    print(f"\nlean_1 on one GPU, 2 ranks vs fp32 on one process: {rank_mean} vs {single.losses}")
    assert max(abs(a - b) for a, b in zip(rank_mean, single.losses)) < FSDP_BF16_LOSS_ATOL


@quick
def test_fp16_with_grad_scaler_trains_like_fp32(char_data):
    """The CPU test's bounds (tests/optimizations/test_precision.py), with what speed_5 really uses on CUDA."""
    amp = mixed_precision(tiny_config(char_data, amp=True, device="cuda"), torch.device("cuda"))
    assert amp.dtype == torch.float16 and amp.scaler.is_enabled()
    check_fp16_tracks_fp32(char_data, amp, "cuda")


@quick
def test_pinned_non_blocking_copies_give_identical_batches(char_data):
    """A non-blocking copy from pinned memory gives the host batch exactly, as the blocking copy does.

    Tolerance 0: the copy from pinned memory is only queued (non_blocking); once synchronised it must equal the host
    batch and the blocking copy from pageable memory."""
    cuda = torch.device("cuda")
    pinned, pageable = tiny_config(char_data, pin_memory=True), tiny_config(char_data, pin_memory=False)
    dataset = make_dataset(pinned.dataset, pinned.data_dir, pinned.block_size)
    batch = next(iter(make_loader(dataset, WindowSampler(len(dataset), 8, 1, 0), pinned, cuda)))
    assert all(t.is_pinned() for t in batch)
    queued = to_device(batch, cuda, pinned)  # non_blocking=True
    blocking = to_device(tuple(t.clone() for t in batch), cuda, pageable)
    torch.cuda.synchronize()
    for a, b, host in zip(queued, blocking, batch):
        assert a.device.type == "cuda" and torch.equal(a.cpu(), host) and torch.equal(a, b)


@two_gpus
def test_compiled_ddp_stage_records_its_cuda_graphs_once(char_data, tmp_path, monkeypatch):
    """speed_6_ddp (compiled, CUDA graphs, DDP over NCCL) records its CUDA graphs once and never recompiles.

    Run as a user runs it, with the compiler's logs on: no recompilation and no CUDA graph recorded again (a
    re-recording costs a recording's time and pool memory each time): the graphs recorded with 1 timed repeat are all
    there are with 3. The allocator snapshot lands beside the record (rank 0 writes it)."""
    monkeypatch.setenv("TORCH_LOGS", "recompiles,+torch._inductor.cudagraph_trees")
    recordings = []
    for repeats in (1, 3):
        out = tmp_path / f"repeats_{repeats}"
        r = run_stage(
            "--profile",
            "smoke",
            "--device",
            "cuda",
            "--data-dir",
            str(char_data),
            "--out",
            str(out),
            "--repeats",
            str(repeats),
            stage="speed_6_ddp",
        )
        log = r.stdout + r.stderr
        assert r.returncode == 0, log[-3000:]
        record = read_record(record_path(out, "speed_6_ddp"))
        assert record_problems(record) == [] and record["choices"]["compile_mode"] == "reduce-overhead"
        assert "Recompiling function" not in log and "Re-recording function" not in log
        recordings.append(len(re.findall(r"Recording function=", log)))
        assert (out / "speed_6_ddp.memory.pickle").is_file() and record["metrics"]["memory_snapshot"]
        assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    assert recordings[0] > 0, "no CUDA graph recording in the log: the log settings did not take effect"
    assert recordings[1] == recordings[0]


# ---- every memory and lean stage, and the fast ladder, on CUDA -------------------------------------------------


def stage_on_cuda(stage: str, data_dir, out) -> tuple[subprocess.CompletedProcess, dict]:
    """`stage` at the smoke profile's small shapes on CUDA, with its memory step (the allocator's history of a step).

    A DDP/FSDP stage runs on 2 GPUs where there are 2, else as 1 rank under torchrun (FSDP over a mesh of one: the same
    code paths, all-gather and reduce-scatter included)."""
    script = [str(STAGES_DIR / f"{stage}.py"), *smoke_stage_argv(data_dir, out, "cuda")]
    one_rank = stage_config(stage, "smoke").distributed and torch.cuda.device_count() < 2
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"] if one_rank else []
    r = subprocess.run([sys.executable, *launcher, *script], capture_output=True, text=True, timeout=600)
    return r, read_record(record_path(out, stage))


@pytest.mark.parametrize("stage", stages_of("memory") + stages_of("lean"))
def test_memory_and_lean_stages_finish_with_their_memory_step(stage, char_data, tmp_path):
    """The memory and lean stages finish on CUDA with their memory step, where two of them once crashed.

    On torch 2.11 the memory step crashed under activation checkpointing (memory_2 on): the allocator's history and
    checkpointing's early stop (gpt/optimizations/checkpointing.py:checkpoint_blocks). lean_3 on 2 GPUs died at its
    first optimizer step while its group had NCCL only (clip_grad_norm_ all-reduces host gradients:
    tests/test_process_group.py holds that on the CPU, this the real "cuda:nccl,cpu:gloo" group)."""
    r, record = stage_on_cuda(stage, char_data, tmp_path)
    assert r.returncode == 0 and record["status"] == "ok", (r.stdout + r.stderr)[-4000:]
    m = record["metrics"]
    assert (tmp_path / m["memory_snapshot"]).is_file() and m["memory_breakdown_mib"]["total"] > 0
    assert max(m["memory_timeline_mib"]) == pytest.approx(m["memory_breakdown_mib"]["total"], abs=0.01)


@quick
def test_checkpointing_with_early_stop_is_what_crashed_the_memory_step(char_data):
    """The diagnosis behind checkpoint_blocks' early_stop=False: checkpointing's early stop crashed the memory step.

    As a control: one checkpointed step while the allocator records Python stacks. With PyTorch's default early stop,
    torch 2.11 raised "SystemError: <built-in method dropout ...> returned NULL without setting an exception" (an
    exception lost on its way out of the op); the ladder's setting runs. On other versions only the ladder's setting is
    asserted."""
    cfg = tiny_config(char_data, device="cuda", dropout=0.1, activation_checkpointing=True)
    cuda = torch.device("cuda")
    x = torch.randint(60, (8, cfg.block_size), device=cuda)

    def step(early_stop: bool):
        raw, model, optimizer = train.build_model(cfg, 65, cuda)
        if early_stop:
            with_pytorchs_early_stop(raw)
        torch.cuda.memory._record_memory_history(stacks="python", max_entries=100_000)
        try:
            train.train_step(model, optimizer, x, x, cfg, mixed_precision(cfg, cuda))
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)

    step(early_stop=False)
    if torch.__version__.startswith("2.11"):
        with pytest.raises(SystemError, match="returned NULL without setting an exception"):
            step(early_stop=True)


@pytest.mark.parametrize("stage", stages_of("fast"))
def test_fast_stages_run_on_cuda(stage, char_data, tmp_path):
    """Every fast stage runs compiled on CUDA.

    fast_6's record names the loss it computed (on torch 2.11 without liger-kernel or Cut Cross-Entropy, the chunked
    one is plain PyTorch's chunks) and, where it kept the full one, why."""
    r, record = stage_on_cuda(stage, char_data, tmp_path)
    assert r.returncode == 0 and record["status"] == "ok", (r.stdout + r.stderr)[-4000:]
    assert record["metrics"]["profiler"]["compiled_regions_per_step"] >= 1  # compiled since speed_4
    if stage_config(stage, "smoke").loss == "chunked":
        choices = record["choices"]
        assert choices["loss"] in chunked_loss.LOSSES and (choices["loss"] == "chunked" or choices["loss_why"])


@quick
@pytest.mark.parametrize("stage", ["fast_2_bf16", "fast_3_sdpa"])
def test_planner_estimates_the_attention_kernels_within_10_percent(stage, char_data):
    """The planner estimates the CUDA attention kernels within 10% of max_memory_allocated.

    Measured at the reference profile's fast shapes (gpt-mini, batch 256, block 128), one eager step after one warm-up:
    the naive attention (fast_2) and SDPA with dropout (fast_3), whose CUDA kernel the planner simulates
    (gpt/memory/estimator.py:_cuda_sdpa). Its old estimate, the CPU's math path, was twice what the H100 measured. 10%
    is the issue's bound; cuBLAS workspaces (unmodelled, ~64 MiB) are ~4% here."""
    from gpt.memory.planner import compare_records

    cfg = stage_config(
        stage, "reference", data_dir=str(char_data), device="cuda", compile=False, repeats=1, warmup_iters=1
    )
    cfg.samples = cfg.batch_size
    record = {"stage": stage, **protocol.run(cfg, label=stage)}
    [row] = compare_records([record], progress=print)
    assert row["target"] == "cuda" and abs(row["error_pct"]) < 10, row


@quick
def test_gathered_batches_on_cuda_are_the_dataloaders_batches(char_data):
    """fast_1's batches, gathered on the GPU, are the DataLoader's batches of the same sampler.

    Tolerance 0: fast_1 gathers its batches on the GPU from the token array there, and the host draws only the start
    indices."""
    cfg = tiny_config(char_data)
    dataset = make_dataset("tokens", cfg.data_dir, cfg.block_size)
    sampler = lambda: WindowSampler(len(dataset), 8, 4, seed=5)  # noqa: E731
    loaded = list(make_loader(dataset, sampler(), cfg, torch.device("cpu")))
    gathered = list(GatheredBatches(dataset, sampler(), torch.device("cuda")))
    assert gathered[0][0].is_cuda and gathered[0][0].dtype == torch.int64
    for (xg, yg), (xl, yl) in zip(gathered, loaded, strict=True):
        assert torch.equal(xg.cpu(), xl) and torch.equal(yg.cpu(), yl)


@quick
@pytest.mark.parametrize("impl", chunked_loss.IMPLEMENTATIONS)
def test_each_installed_chunked_loss_tracks_fp32_like_the_full_loss(impl):
    """Each installed chunked loss is as close to fp32 as the full bf16 loss, and the padding rows get no gradient.

    fast_6's shape class on CUDA (GPT-2's vocabulary padded to 50304, bf16 inputs as under autocast): each installed
    implementation's loss and gradients are as close to fp32 as the full bf16 loss's (bound: twice its difference plus
    1e-3 of the largest gradient for liger, which accumulates the weight gradient in fp32; torch and Cut Cross-Entropy
    add theirs in bf16, and plain rounds each chunk's part to bf16 before its fp32 sum, so plus
    BF16_CHUNKED_WEIGHT_GRAD, the CPU test's bound: cce measured 1.7e-2 against 4.6e-3 on an H100)."""
    if not chunked_loss.installed(impl):  # the reason says what is missing ("torch is not installed" said nothing)
        pytest.skip(chunked_loss.why_unavailable(impl, "cuda"))
    cuda, vocab, padded = torch.device("cuda"), 50257, 50304
    g = torch.Generator(device=cuda).manual_seed(0)
    x = torch.randn(2048, 768, device=cuda, generator=g)
    weight = torch.randn(padded, 768, device=cuda, generator=g) * 0.02
    weight[vocab:] = 0
    bias = torch.zeros(padded, device=cuda)
    bias[vocab:] = float("-inf")
    targets = torch.randint(vocab, (2048,), device=cuda, generator=g)

    def grads(fn, dtype):
        xi, wi = x.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            loss = fn(xi, wi)
        loss.backward()
        return loss.float().item(), {"x": xi.grad.float(), "weight": wi.grad.float()}

    def full(xi, wi):
        return torch.nn.functional.cross_entropy(torch.nn.functional.linear(xi, wi, bias).float(), targets)

    def chunked(xi, wi):
        return chunked_loss.chunked_cross_entropy(xi, wi, targets, vocab, bias, impl=impl)

    loss_fp32, grads_fp32 = grads(full, torch.float32)
    loss_full, grads_full = grads(full, torch.bfloat16)
    loss_chunked, grads_chunked = grads(chunked, torch.bfloat16)
    full_rel, chunked_rel = max_diff(grads_full, grads_fp32)[1], max_diff(grads_chunked, grads_fp32)[1]
    print(
        f"\n{impl}: bf16 vs fp32 gradients {chunked_rel:.3g} (full loss {full_rel:.3g}); losses {loss_chunked:.5f} "
        f"vs {loss_fp32:.5f}"
    )
    assert chunked_rel < 2 * full_rel + (1e-3 if impl == "liger" else BF16_CHUNKED_WEIGHT_GRAD)
    assert loss_chunked == pytest.approx(loss_fp32, rel=1e-2)
    assert grads_chunked["weight"][vocab:].abs().max() == 0


@pytest.mark.parametrize("stage", LEARNING_STAGES)
def test_stages_train_to_a_loss_on_cuda(stage, char_data):
    """Eager fp32, fp16 with its GradScaler and compiled bf16 with CUDA graphs train to a loss on CUDA.

    Training to a loss (README "Time to loss"): each stage learns on a budget of the same number of steps (the CPU
    learns on it too: tests/test_time_to_loss.py), evaluated off the clock (synchronised at every evaluation only), with
    the first step's start-up given apart; the record is complete."""
    cfg = learning_budget(stage, char_data, "cuda")
    record = time_to_loss.run(cfg, label=stage)
    m = record["metrics"]
    assert m["val_loss_final"] < 0.8 * m["val_loss_initial"]  # ~4.4 (uniform over 65 characters) -> ~3.2 on the CPU
    assert all(p["seconds"] <= q["seconds"] for p, q in zip(m["curve"], m["curve"][1:]))
    assert m["tokens"] == m["steps"] * cfg.tokens_per_step and m["eval_seconds"] > 0 and m["startup_s"] >= 0
    record.update(stage=stage, ladder=stage.split("_")[0], profile="smoke", parent=None, mode="time_to_loss")
    assert record_problems(record) == []


# ---- the speedrun on CUDA: Muon, the last stage with its CUDA graphs, its schedule, the noise scale -------------


@quick
def test_muons_newton_schulz_in_bf16_on_cuda_is_near_orthogonal_and_near_float32():
    """Muon's Newton-Schulz in bf16 on CUDA is near orthogonal and near its float32 result.

    torch's Muon orthogonalises in bf16 on the GPU's tensor cores (cuBLAS may also reduce in bf16): the bound is the CPU
    twin's, derived from bf16's precision (tests/optimizations/test_muon.py: NEWTON_SCHULZ_BF16)."""
    check_newton_schulz_in_bf16("cuda")


@quick
def test_a_muon_step_on_cuda_matches_float32_on_the_cpu(char_data, monkeypatch):
    check_a_bf16_muon_step_matches_fp32_on_the_cpu(char_data, "cuda", monkeypatch)


@quick
def test_a_batched_muon_step_on_cuda_matches_float32_on_the_cpu(char_data, monkeypatch):
    """speedrun_18's BatchedMuon on CUDA, within the bf16 bound of torch's own Muon there.

    On the CPU it is torch's step to the last bit (tests/optimizations/test_muon.py); cuBLAS's batched products need
    not add in the same order as its single ones, so on CUDA it is held to the bound torch's own bf16 step meets."""
    check_a_bf16_muon_step_matches_fp32_on_the_cpu(char_data, "cuda", monkeypatch, muon_batched=True)


@quick
def test_the_plain_optimizers_steps_on_cuda_equal_muon_with_adamws(char_data):
    """speedrun_21's PlainMuonAdamW on CUDA: MuonWithAdamW's steps there to the last bit (the same CUDA kernels)."""
    check_plain_steps_equal_torchs(char_data, "cuda")


@pytest.fixture(scope="module")
def speedrun_on_cuda(char_data):
    """speedrun_5_wsd's run to a loss on CUDA, watched (tests/test_speedrun.py: trace_last_stage)."""
    return trace_last_stage(char_data, "cuda")


def test_the_speedruns_last_stage_learns_compiled_and_records_its_cuda_graphs_once(speedrun_on_cuda):
    """The speedrun's last stage learns compiled with CUDA graphs, and records its graphs once.

    The modern blocks (rotary, QK-norm, RMSNorm, ReLU²) and Muon under torch.compile's "reduce-overhead" mode, bf16
    autocast and CUDA graphs, evaluated between two replays at every step: the loss falls, nothing compiles again, and
    the graphs are recorded once, not at each evaluation."""
    check_the_last_stage_learns_compiled(speedrun_on_cuda)


def test_the_speedruns_optimizer_groups_follow_wsd_on_cuda(speedrun_on_cuda):
    check_the_groups_follow_wsd(speedrun_on_cuda)


def test_the_noise_scale_measures_on_cuda(char_data, tmp_path):
    """python -m gpt.noise_scale measures on CUDA at the smoke profile's shapes, and its record names the GPU.

    speed_0's run (fp32, eager) with its batches halved, then t(B) with speedrun_1's code compiled with CUDA graphs at
    each batch."""
    record = measure_smoke(char_data, "cuda", tmp_path / "noise.json")
    check_smoke_measurement(record)
    assert record["device"] == torch.cuda.get_device_name()


@quick
def test_the_attention_race_on_cuda_times_both_kernels_and_keeps_the_random_states():
    """The attention decision on CUDA (gpt/clocks.py:race, which synchronises after each call) at the speedrun's shape.

    Two finite, positive times, and the CPU's and CUDA's random states as they were (a stage measures this right after
    seeding its model). Not yet run on a GPU."""
    import math

    from gpt.optimizations.fused_attention import time_attentions

    device = torch.device("cuda")
    torch.manual_seed(0)
    cpu_state, cuda_state = torch.get_rng_state(), torch.cuda.get_rng_state(device)
    times = time_attentions(48, 4, 64, 32, torch.bfloat16, 0.0, compiled=False, device=device)
    assert len(times) == 2 and all(math.isfinite(t) and t > 0 for t in times), times
    assert torch.equal(torch.get_rng_state(), cpu_state) and torch.equal(torch.cuda.get_rng_state(device), cuda_state)

"""More than one process (gpt/optimizations/parallel.py): DDP and FSDP match one process on the combined batch.

DDP (speed_6) and FSDP (memory_4) on 2 gloo processes match one process on the combined batch, and a reduction that sums
the ranks' gradients fails that comparison; FSDP's bf16 parameters with an fp32 reduction (lean_1, and with the chunked
loss lean_2) track fp32; CPU offload (lean_3) keeps memory_4's numbers; every FSDP unit gets the stage's policies. On
the CPU, through the project's own code (tests/equivalence.py; the ranks run tests/dist_worker.py); on 2 GPUs in
tests/test_gpu.py."""

import contextlib
import json
import os
import signal
import subprocess
import sys
from unittest import mock

import pytest
import torch
from conftest import REPO
from dist_worker import full_params, param_name
from equivalence import CPU, NO_CLIP, global_norm, loader_batches, report, tiny_config, train_with_grads

from gpt.config import TrainConfig
from gpt.ladder import STAGES_DIR
from gpt.optimizations import owner
from gpt.optimizations.parallel import fsdp_policies
from gpt.stage import EXIT_SKIPPED
from gpt.train import build_model

# ---- DDP (speed_6) and FSDP (memory_4) on 2 gloo processes ------------------------------------------------

NPROC, RANK_BATCH, DIST_STEPS = 2, 4, 3


LAUNCH_TIMEOUT_S = 180


# Each rank averages its 4 samples and the gradients are averaged across ranks (all-reduce or
# reduce-scatter); one process averages all 8: the same sum in another order (float32 reassociation).
# Gradients are compared at every step with clipping off (NO_CLIP), as in the accumulation test: the clip
# would rescale both sides to norm 1 and so hide a wrong scale, such as ranks' gradients summed instead of
# averaged (the negative control below); measured <= 7.5e-8, <= 25% of the allowance. Parameters after 3 AdamW steps:
# Adam divides by sqrt(v), so where a gradient is tiny its rounding reaches the update; measured ~1.4e-7,
# bound 1e-6 = 0.2% of one step's move (lr 5e-4), while a wrong batch or a missing all-reduce moves
# weights by ~lr (a doubled gradient does not: Adam divides it out, so the gradients are the check of the scale).
DIST_GRAD_RTOL, DIST_GRAD_ATOL = 1e-5, 1e-7


DIST_PARAM_RTOL, DIST_PARAM_ATOL = 1e-5, 1e-6


def launch_workers(cfg: TrainConfig, steps: int, out, *worker_args: str) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={NPROC}",
        str(REPO / "tests" / "dist_worker.py"),
        "--config",
        json.dumps(cfg.to_dict()),
        "--steps",
        str(steps),
        "--out",
        str(out),
        *worker_args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 processes share 2 cores
    log = out / "torchrun.log"  # a file, not a pipe: a stray process holding a pipe open cannot block us
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            pytest.fail(f"torchrun did not finish in {LAUNCH_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")
    assert proc.returncode == 0, f"torchrun exited with {proc.returncode}:\n{log.read_text()[-3000:]}"


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill torchrun and its ranks.

    The ranks run in sessions of their own (torchrun starts them so), so killing torchrun's process group would orphan
    them: collect their ids from /proc first."""

    def children(pid):
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return []
        found = []
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    found += [int(c) for c in f.read().split()]
            except OSError:
                pass
        return found + [d for c in found for d in children(c)]

    ranks = children(proc.pid)
    for pid in [-proc.pid, *ranks]:  # -pid: torchrun's whole process group
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone
            pass
    proc.wait()


@pytest.mark.parametrize(
    "mode, stage_settings",
    [
        # grad_accum_steps=2 also runs DDP's no_sync() path (gradients all-reduced on the last micro-batch only).
        ("ddp", dict(grad_accum_steps=2)),
        # the memory ladder's earlier changes, as memory_4 runs them, composed with sharding
        ("fsdp", dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False)),
    ],
)
def test_two_processes_match_one_process_on_the_combined_batch(mode, stage_settings, char_data, tmp_path):
    check_two_processes_match_one(
        mode,
        stage_settings,
        char_data,
        tmp_path,
        "cpu",
        (DIST_GRAD_RTOL, DIST_GRAD_ATOL),
        (DIST_PARAM_RTOL, DIST_PARAM_ATOL),
    )


def check_two_processes_match_one(
    mode, stage_settings, char_data, tmp_path, device, grad_tol, param_tol, worker_args: tuple = ()
) -> None:
    """Also run on 2 GPUs (NCCL) and on one GPU shared by 2 ranks (gloo) by tests/test_gpu.py. Tolerances: (rtol, atol).

    `worker_args`: tests/dist_worker.py's options (--one-gpu)."""
    # Dropout 0: the ranks draw masks from their own RNG streams, so masks could not match.
    cfg = tiny_config(
        char_data,
        distributed=mode,
        nproc=NPROC,
        batch_size=RANK_BATCH,
        device=device,
        grad_clip=NO_CLIP,
        **stage_settings,
    )
    launch_workers(cfg, DIST_STEPS, tmp_path, *worker_args)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(NPROC)]
    single, grads_single = train_with_grads(
        tiny_config(char_data, batch_size=NPROC * RANK_BATCH, device=device, grad_clip=NO_CLIP), DIST_STEPS
    )
    grads_single = [{k: g.cpu() for k, g in grads.items()} for grads in grads_single]
    params_single = {k: p.cpu() for k, p in full_params(single.gpt).items()}

    # The sampler's promise, checked on what the ranks really trained on: at every step the ranks'
    # batches, in rank order, are the single process's batch.
    assert torch.equal(torch.cat([r["inputs"] for r in ranks], dim=1), torch.stack(single.inputs).cpu())
    rank_mean = [sum(losses) / NPROC for losses in zip(*(r["losses"] for r in ranks))]
    assert rank_mean == pytest.approx(single.losses, rel=1e-5)
    # Identical weights (compared below), but each rank its own dropout masks: build_model reseeds with the
    # rank, so rank 0 draws what one process draws, and rank 1 other masks.
    assert torch.equal(ranks[0]["rng"], single.rng) and not torch.equal(ranks[1]["rng"], single.rng)

    for step, (gd, gs) in enumerate(zip(ranks[0]["grads"], grads_single)):
        report(f"{mode} x{NPROC} vs one process, step {step + 1} gradients", gd, gs, *grad_tol)
        torch.testing.assert_close(gd, gs, rtol=grad_tol[0], atol=grad_tol[1])
    report(
        f"{mode} x{NPROC} vs one process, parameters after {DIST_STEPS} steps",
        ranks[0]["params"],
        params_single,
        *param_tol,
    )
    torch.testing.assert_close(ranks[0]["params"], params_single, rtol=param_tol[0], atol=param_tol[1])


# fsdp on demand: the ddp case shows the comparison fails on a wrong reduction; both run with -m slow
@pytest.mark.parametrize(
    "mode, stage_settings", [("ddp", dict(grad_accum_steps=2)), pytest.param("fsdp", {}, marks=pytest.mark.slow)]
)
def test_ranks_gradients_summed_not_averaged_fail_that_comparison(mode, stage_settings, char_data, tmp_path):
    """Negative control: the ranks' gradients summed, not averaged, fail the gradient comparison.

    A reduction that sums the ranks' gradients (each W = 2 times too large) is rejected by the gradient comparison
    above, which clipping would have passed."""
    cfg = tiny_config(
        char_data, distributed=mode, nproc=NPROC, batch_size=RANK_BATCH, grad_clip=NO_CLIP, **stage_settings
    )
    launch_workers(cfg, 1, tmp_path, "--summed-reduction")
    (grads_summed,) = torch.load(tmp_path / "rank0.pt")["grads"]
    _, (grads_single,) = train_with_grads(tiny_config(char_data, batch_size=NPROC * RANK_BATCH, grad_clip=NO_CLIP), 1)
    print(f"\n{mode} summed: gradient norm {global_norm(grads_summed):.4g} vs {global_norm(grads_single):.4g}")
    assert global_norm(grads_summed) == pytest.approx(NPROC * global_norm(grads_single), rel=1e-5)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(grads_summed, grads_single, rtol=DIST_GRAD_RTOL, atol=DIST_GRAD_ATOL)


def test_fsdp_shards_on_a_mesh_of_the_stage_device_not_the_default_one(char_data):
    """FSDP shards on a mesh of the stage's device, not the default one.

    Without a mesh, fully_shard builds one on the machine's accelerator (a CPU stage would move to cuda:0 on a machine
    with a GPU). parallelize passes its own, so fully_shard's default must never be built."""
    from torch.distributed.fsdp._fully_shard import _fully_shard

    cfg = tiny_config(char_data, distributed="fsdp", nproc=NPROC)
    with fake_process_group():
        with mock.patch.object(_fully_shard, "_init_default_mesh", side_effect=AssertionError("default mesh")):
            raw, model, _ = build_model(cfg, 65, CPU)
        assert len(fsdp_units(raw)) == cfg.n_layer + 1  # every block and the root
        meshes = {p.device_mesh for p in raw.parameters()}
        assert len(meshes) == 1 and meshes.pop().device_type == "cpu"
        assert all(p.device.type == "cpu" for p in raw.parameters())


@contextlib.contextmanager
def fake_process_group():
    """A fake process group: NPROC ranks, this process rank 0, and no collective that really runs.

    torch's "fake" backend: enough to build a stage's FSDP units in the test process."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers "fake"

    torch.distributed.init_process_group("fake", rank=0, world_size=NPROC, store=FakeStore())
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def fsdp_units(raw) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in raw.modules() if isinstance(m, FSDPModule)]


# ---- FSDP mixed precision (lean_1) and with the chunked loss (lean_2), on 2 gloo processes ---------------------

# The reduction: FSDP's MixedPrecisionPolicy computes each rank's micro-batches with bf16 parameters and promises to
# reduce their gradients in fp32, so the ranks' sum loses nothing to bf16. fsdp_bf16_first_gradients computes that
# promise on one process: the same bf16 operations (tolerance 0 for them), then the fp32 average and sum in another
# order and the clip's norm summed in another order: fp32 reassociation, a few roundings of 2^-24 each (measured
# 1.1e-7 norm-wise). A reduction in bf16 (the policy without reduce_dtype reduces in param_dtype) rounds each reduced
# gradient once more: adding two bf16 values of one exponent takes a 9th bit, dropped on about half the entries, half
# a bf16 ulp (2^-8 relative) each: ~2^-9 norm-wise (measured 1.5e-3). The bound, 2^-12, is ~2^11 times the
# reassociation and 1/8 of one bf16 rounding. The update check below cannot see it (4.81% either way).
FSDP_BF16_REDUCE_REL = 2**-12


# The update: bf16 compute rounds every op's output (FSDP runs the whole unit in bf16: layer norms and residual adds
# too) by up to u = 2^-8, so step 1's gradients differ from fp32's (measured 0.37% norm-wise, up to 1.0% for one
# tensor). Adam divides each gradient by its own size: an entry whose true gradient is smaller than its rounding error
# (the attention's key bias, whose true gradient is 0, and other near-zero entries) moves by lr the other way, a
# difference of 2 lr where a well-sized entry's is ~1% of lr. With a fraction f of entries flipping, the update
# differs by ~2 sqrt(f): measured f = 0.32% at step 1, so 11% (Adam's eps softens it: 9.0% measured); later steps'
# moments average the flips out (4.8% after 3 steps). f is set by how many gradients lie near 0, not by u, so no
# bound follows from u alone: 15% is step 1's estimate with margin, a check that bf16 training tracks fp32 (a
# learning rate 20% lower gives 20%, asserted as a control), not of the reduction (FSDP_BF16_REDUCE_REL is).
# Losses: within 2e-3, as under autocast; the chunked loss is returned in bf16 (test_chunked_loss.py), which adds up
# to half a bf16 unit (2^-8 relative) per micro-batch.
FSDP_BF16_UPDATE_REL, FSDP_BF16_LOSS_ATOL = 0.15, 2e-3


def fsdp_bf16_first_gradients(cfg, char_data) -> dict:
    """Step 1's gradients under MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), computed on one process.

    As its contract says: each rank's micro-batches through a bf16 copy of the model (FSDP gathers bf16 parameters and
    casts the inputs), each gradient cast to fp32, averaged over the ranks and summed over the micro-batches in fp32,
    then clipped as train_step clips (activation checkpointing recomputes the same numbers: left out). On one thread, as
    the ranks run (launch_workers): a matmul blocked for more threads sums in another order, and its bf16 output then
    differs by an ulp here and there (measured 7e-5 norm-wise with 2 threads)."""
    x, y = loader_batches(tiny_config(char_data, batch_size=cfg.nproc * cfg.batch_size), 1)[0]  # ranks' in order
    raw = train_with_grads(tiny_config(char_data, loss=cfg.loss, goal=cfg.goal), 0)[0].gpt.to(torch.bfloat16)
    params = {param_name(n): p for n, p in raw.named_parameters()}
    total = {k: torch.zeros_like(p, dtype=torch.float32) for k, p in params.items()}
    k, threads = cfg.grad_accum_steps, torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for xr, yr in zip(x.chunk(cfg.nproc), y.chunk(cfg.nproc)):
            for xm, ym in zip(xr.chunk(k), yr.chunk(k)):
                grads = torch.autograd.grad(raw(xm, ym)[1] / k, list(params.values()))
                for name, g in zip(params, grads):
                    total[name] += g.float() / cfg.nproc
    finally:
        torch.set_num_threads(threads)
    clip = min(1.0, cfg.grad_clip / (global_norm(total) + 1e-6))
    return {name: g * clip for name, g in total.items()}


def update_error(params: dict, reference: dict, initial: dict) -> float:
    """||(params - initial) - (reference - initial)|| / ||reference - initial||, over all parameters."""
    diff = torch.cat([(params[k] - reference[k]).flatten() for k in reference])
    moved = torch.cat([(reference[k] - initial[k]).flatten() for k in reference])
    return (diff.norm() / moved.norm()).item()


@pytest.mark.parametrize(
    "stage_settings",
    [
        dict(fsdp_mixed_precision=True),  # lean_1
        # lean_2 on demand: the chunked loss has its own tests; the default suite stays under 10 min on 2 cores
        pytest.param(dict(fsdp_mixed_precision=True, loss="chunked"), marks=[pytest.mark.slow]),  # lean_2
    ],
)
def test_fsdp_bf16_parameters_track_fp32_on_one_process(stage_settings, char_data, tmp_path):
    memory_4 = dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False)
    # goal "memory", as the lean ladder runs (gpt/ladder.py:Ladder.goal): the chunked loss is kept whatever its time
    cfg = tiny_config(
        char_data, distributed="fsdp", nproc=NPROC, batch_size=RANK_BATCH, goal="memory", **memory_4, **stage_settings
    )
    launch_workers(cfg, DIST_STEPS, tmp_path, "--cpu-bf16")  # bf16 even where this CPU would keep fp32
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(NPROC)]
    assert all(r["model_loss"] == cfg.loss for r in ranks)  # the built model computes the loss under test
    single = train_with_grads(tiny_config(char_data, batch_size=NPROC * RANK_BATCH), DIST_STEPS)[0]
    initial = full_params(train_with_grads(tiny_config(char_data), 0)[0].gpt)  # the same seed's weights
    params = ranks[0]["params"]
    assert all(p.dtype == torch.float32 for p in params.values())  # fp32 master weights
    emulated, first = fsdp_bf16_first_gradients(cfg, char_data), ranks[0]["grads"][0]
    reduce_error = global_norm({n: first[n] - emulated[n] for n in emulated}) / global_norm(emulated)
    print(f"\nstep 1 gradients vs bf16 compute with an fp32 reduction: {reduce_error:.3g} norm-wise")
    assert reduce_error < FSDP_BF16_REDUCE_REL
    rank_mean = [sum(losses) / NPROC for losses in zip(*(r["losses"] for r in ranks))]
    print(f"\nFSDP bf16 {stage_settings} vs fp32 losses: {rank_mean} vs {single.losses}")
    bf16_loss = 2**-8 * max(single.losses) if cfg.loss == "chunked" else 0.0
    assert max(abs(a - b) for a, b in zip(rank_mean, single.losses)) < FSDP_BF16_LOSS_ATOL + bf16_loss
    error = update_error(params, full_params(single.gpt), initial)
    slower = train_with_grads(tiny_config(char_data, batch_size=NPROC * RANK_BATCH, lr=0.8 * cfg.lr), DIST_STEPS)[0]
    control = update_error(full_params(slower.gpt), full_params(single.gpt), initial)
    print(
        f"update after {DIST_STEPS} steps vs fp32 on one process: {error:.3g} relative "
        f"(fp32 at 0.8 x lr: {control:.3g})"
    )
    assert error < FSDP_BF16_UPDATE_REL < control


# ---- CPU offload (lean_3) ----------------------------------------------------------------------------------


def test_cpu_offload_is_skipped_without_a_gpu(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            str(STAGES_DIR / "lean_3_cpu_offload.py"),
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--out",
            str(tmp_path),
            "--wandb",
            "disabled",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == EXIT_SKIPPED, r.stderr
    record = json.loads((tmp_path / "lean_3_cpu_offload.json").read_text())
    # every reason is given, so on a torch without F.linear_cross_entropy (2.11) the chunked loss's comes too
    reasons = record["reason"].split("; ")
    assert record["status"] == "skipped" and any(r.startswith("nothing to offload to") for r in reasons), reasons
    assert record["config"]["fsdp_cpu_offload"] and record["config"]["fsdp_mixed_precision"]


# lean_3 over memory_4, mixed precision aside (lean_1's check; an AMX CPU would compute in bf16): CPU offload runs
# torch's other code paths, sharded parameters and gradients kept as host tensors, each unit's shard copied to the
# compute device before its all-gather and its gradient copied back, AdamW stepping the host shards. On a CPU the
# copies are host to host (unpinned: fsdp_policies), and the sums the same as memory_4's, in the same order: its
# float32 bounds hold. What a CPU cannot check, the copies to and from a GPU: tests/test_gpu.py.
LEAN_3 = dict(grad_accum_steps=2, activation_checkpointing=True, optimizer_foreach=False, fsdp_cpu_offload=True)


def test_cpu_offload_on_two_processes_matches_one_process(char_data, tmp_path):
    check_two_processes_match_one(
        "fsdp", LEAN_3, char_data, tmp_path, "cpu", (DIST_GRAD_RTOL, DIST_GRAD_ATOL), (DIST_PARAM_RTOL, DIST_PARAM_ATOL)
    )


def test_every_fsdp_unit_gets_the_offload_and_precision_policies(monkeypatch, char_data):
    """Every FSDP unit, each block and the root, gets the offload and precision policies.

    A unit sharded without them trains the same (the comparison above cannot see it) but keeps its parameters, gradients
    and AdamW state on the GPU, or computes in fp32: every block and the root must get them."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    rates = {torch.bfloat16: 2.0, torch.float32: 1.0}
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_rates_in_turns", lambda dtypes, n: (n, rates))
    cfg = tiny_config(char_data, distributed="fsdp", nproc=NPROC, fsdp_mixed_precision=True, fsdp_cpu_offload=True)
    with fake_process_group():
        groups = [unit._get_fsdp_state()._fsdp_param_group for unit in fsdp_units(build_model(cfg, 65, CPU)[0])]
    assert len(groups) == cfg.n_layer + 1
    assert all(isinstance(g.offload_policy, CPUOffloadPolicy) for g in groups)
    assert all(p.offload_to_cpu and not p.pin_memory for g in groups for p in g.fsdp_params)
    assert all(g.mp_policy == fsdp_policies(cfg, CPU)["mp_policy"] for g in groups)


def test_fsdp_policies_follow_the_config(monkeypatch, char_data):
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    rates = {torch.float32: 300e9, torch.bfloat16: 2400e9}  # a CPU with AMX
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_rates_in_turns", lambda dtypes, n: (n, rates))
    assert fsdp_policies(tiny_config(char_data, distributed="fsdp"), CPU) == {}
    lean_3 = tiny_config(char_data, distributed="fsdp", fsdp_mixed_precision=True, fsdp_cpu_offload=True)
    policies = fsdp_policies(lean_3, CPU)
    assert policies["mp_policy"] == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    assert isinstance(policies["offload_policy"], CPUOffloadPolicy) and not policies["offload_policy"].pin_memory
    assert fsdp_policies(lean_3, torch.device("cuda"))["offload_policy"].pin_memory  # fast copies to the GPU
    assert owner("fsdp_mixed_precision").no_effect(lean_3, CPU) is None

    rates[torch.bfloat16] = 1.3e9  # a CPU with AVX2 only: bf16 ~100x slower than fp32, so fp32 is kept
    assert "mp_policy" not in fsdp_policies(lean_3, CPU)
    assert owner("fsdp_mixed_precision").no_effect(lean_3, CPU).startswith("kept fp32 parameters for compute")

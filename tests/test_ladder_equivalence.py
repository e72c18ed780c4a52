"""Every stage that claims to keep the maths is checked against its parent here, on the CPU.

Each test trains a tiny GPT (2 layers, 32 wide, character vocabulary) through the project's own code:
gpt.train.build_model / train_step, gpt.optimizations (the homes), gpt.data.WindowSampler / make_dataset (the
loop is tests/dist_worker.py:run_steps, shared with the torchrun workers). Tolerances are stated per
test: 0 where the same floating-point operations run in the same order, otherwise a bound that float32
reassociation (the same sum added up in another order) or 16-bit rounding explains; the measured
differences are printed (pytest -s).

Gradients are read where AdamW reads them: an optimizer step pre-hook copies every .grad just before
the step (after clipping), since train_step sets them to None once it has stepped.
"""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
from unittest import mock

import pytest
import torch
from conftest import REPO, load_prepare_module
from dist_worker import full_params, record_grads, run_steps
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from gpt import optimizations
from gpt.config import TrainConfig
from gpt.data import WindowSampler, make_dataset
from gpt.optimizations.feeding import make_loader, to_device
from gpt.optimizations.precision import MixedPrecision
from gpt.train import build_model, train_step

CPU = torch.device("cpu")
TINY = dict(
    preset="gpt-mini",
    n_layer=2,
    n_head=2,
    n_embd=32,
    block_size=16,
    dropout=0.0,
    dataset="tokens",
    batch_size=8,
    device="cpu",
    measure_memory=False,
)
NO_CLIP = 1e9  # grad_clip: at this model's gradient norm (~2) a clip coefficient of 1, i.e. no clipping


def tiny_config(data_dir, **overrides) -> TrainConfig:
    return optimizations.validate(TrainConfig(**{**TINY, "data_dir": str(data_dir), **overrides}))


def train_with_grads(cfg: TrainConfig, steps: int, *setups, amp=None):
    grads = []

    def setup(run):
        for s in (record_grads(grads), *setups):
            s(run)

    return run_steps(cfg, steps, setup, amp=amp), grads


def seeded(seed: int):
    """A run_steps setup: reseed the global RNG (dropout's) after build_model seeded the weights."""
    return lambda run: torch.manual_seed(seed)


def max_diff(actual: dict, expected: dict) -> tuple[float, float]:
    """(largest absolute difference, largest difference relative to its tensor's largest magnitude)."""
    assert actual.keys() == expected.keys()
    abs_d = max((actual[k] - expected[k]).abs().max().item() for k in expected)
    rel_d = max(
        ((actual[k] - expected[k]).abs().max() / expected[k].abs().max().clamp_min(1e-30)).item() for k in expected
    )
    return abs_d, rel_d


def report(what: str, actual: dict, expected: dict, rtol: float = 0.0, atol: float = 0.0) -> None:
    """Print the differences, and how much of assert_close's allowance (atol + rtol * |expected|, per
    element) the worst element uses."""
    abs_d, rel_d = max_diff(actual, expected)
    line = f"\n{what}: max |diff| {abs_d:.3g}, max |diff| / max |value| {rel_d:.3g}"
    if rtol or atol:
        used = max(((actual[k] - expected[k]).abs() / (atol + rtol * expected[k].abs())).max().item() for k in expected)
        line += f", {used:.2g} of the tolerance"
    print(line)


def global_norm(grads: dict) -> float:
    return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])).item()


# ---- gradient accumulation (memory_1) --------------------------------------------------------------------

# Two micro-batch means over 16 samples, each halved, summed, vs one mean over 32: the same terms added
# in another order (float32 reassociation, ~1e-7 relative per sum). Step 1 compares gradients at the
# same weights (measured max 3e-8); step 2's weights already carry step 1's rounding, which AdamW
# amplifies where a gradient is tiny (measured max 1.1e-7, entries up to ~0.15). The bound is 5x that;
# the broken patterns below exceed it ~5e4-fold. Clipping is off (NO_CLIP): it would rescale both sides to
# norm 1 and so hide a wrong scale, such as micro-batch losses not divided by their number.
ACCUM_RTOL, ACCUM_ATOL = 1e-5, 5e-7


def test_grad_accumulation_x2_gives_the_gradients_of_the_whole_batch(char_data):
    # Dropout 0: a dropout mask is drawn per forward call, so two micro-batches of 16 would get other
    # masks than one batch of 32 and no gradient could match.
    cfg = dict(batch_size=32, grad_clip=NO_CLIP)
    one, grads_one = train_with_grads(tiny_config(char_data, **cfg), 2)
    two, grads_two = train_with_grads(tiny_config(char_data, grad_accum_steps=2, **cfg), 2)
    assert all(torch.equal(a, b) for a, b in zip(one.inputs, two.inputs))  # the same 32 samples per step
    for step, (g2, g1) in enumerate(zip(grads_two, grads_one)):
        report(f"accumulation x2 vs batch 32, step {step + 1} gradients", g2, g1, ACCUM_RTOL, ACCUM_ATOL)
        torch.testing.assert_close(g2, g1, rtol=ACCUM_RTOL, atol=ACCUM_ATOL)
    assert two.losses == pytest.approx(one.losses, rel=1e-6)


def zero_grad_per_micro_batch(run):
    """The reference's bug: gradients reset inside the micro-batch loop (here: before every micro-batch
    forward of the real train_step), so only the last micro-batch, halved, reaches the optimizer."""
    run.model.register_forward_pre_hook(lambda module, args: run.optimizer.zero_grad(set_to_none=True))


def loss_not_divided(run):
    """The other classic bug: micro-batch losses summed, not averaged (undoes train_step's `/ k`, k = 2)."""
    run.model.register_forward_hook(lambda module, args, out: (out[0], out[1] * 2))


@pytest.mark.parametrize("bug", [zero_grad_per_micro_batch, loss_not_divided])
def test_broken_accumulation_fails_that_comparison(bug, char_data):
    """Negative controls: the comparison above rejects a broken accumulation."""
    cfg = dict(batch_size=32, grad_clip=NO_CLIP)
    _, grads_one = train_with_grads(tiny_config(char_data, **cfg), 1)
    _, grads_bug = train_with_grads(tiny_config(char_data, grad_accum_steps=2, **cfg), 1, bug)
    report(f"{bug.__name__} vs batch 32 gradients", grads_bug[0], grads_one[0], ACCUM_RTOL, ACCUM_ATOL)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(grads_bug[0], grads_one[0], rtol=ACCUM_RTOL, atol=ACCUM_ATOL)


# ---- activation checkpointing (memory_2) -----------------------------------------------------------------


def test_activation_checkpointing_gives_identical_gradients_with_dropout(char_data):
    """Tolerance 0: the recomputed forward runs the same kernels on the same inputs, and checkpointing
    restores the RNG state before it, so dropout draws the same masks again."""
    cfg = dict(dropout=0.1, grad_accum_steps=2)  # as memory_2 runs: after the accumulation stage
    plain, grads_plain = train_with_grads(tiny_config(char_data, **cfg), 2, seeded(1))
    ckpt, grads_ckpt = train_with_grads(tiny_config(char_data, activation_checkpointing=True, **cfg), 2, seeded(1))
    assert all(isinstance(b, CheckpointWrapper) for b in ckpt.raw.transformer.h)
    for step, (gc, gp) in enumerate(zip(grads_ckpt, grads_plain)):
        report(f"checkpointing vs plain, step {step + 1} gradients", gc, gp)
        torch.testing.assert_close(gc, gp, rtol=0, atol=0)
    assert ckpt.losses == plain.losses
    # Control: dropout is really on, i.e. other masks would have failed the comparison.
    _, grads_other = train_with_grads(tiny_config(char_data, **cfg), 1, seeded(2))
    assert max_diff(grads_other[0], grads_plain[0])[1] > 1e-3


def with_pytorchs_early_stop(raw) -> None:
    """Checkpoint raw's blocks again with PyTorch's default (early stop on): the control of the tests below."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    blocks = raw.transformer.h
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block._checkpoint_wrapped_module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)


def test_checkpoint_recomputation_raises_no_exception_through_an_op(char_data, monkeypatch):
    """memory_2 recomputes each block whole (early_stop=False, gpt/optimizations/checkpointing.py): with
    early stop, PyTorch ends a recomputation by raising an exception from inside the block's last op that
    saves a tensor (the MLP's dropout), which torch 2.11 loses on CUDA while the allocator records its
    history (the H100 memory step crashed there). Counted: none in a checkpointed step. Control: the same
    blocks with PyTorch's default raise one per block and micro-batch."""
    import torch.utils.checkpoint as ckpt_module

    raised = []
    init = ckpt_module._StopRecomputationError.__init__
    monkeypatch.setattr(
        ckpt_module._StopRecomputationError, "__init__", lambda self, *a: raised.append(1) or init(self, *a)
    )
    cfg = tiny_config(char_data, dropout=0.1, grad_accum_steps=2, activation_checkpointing=True)
    _, (grads,) = train_with_grads(cfg, 1, seeded(1))
    assert raised == []

    _, (grads_early,) = train_with_grads(cfg, 1, seeded(1), lambda run: with_pytorchs_early_stop(run.raw))
    assert len(raised) == cfg.n_layer * cfg.grad_accum_steps
    torch.testing.assert_close(grads, grads_early, rtol=0, atol=0)  # the same saved tensors either way


# ---- AdamW foreach off (memory_3) ------------------------------------------------------------------------


def test_adamw_for_loop_matches_foreach(char_data):
    """Tolerance 0 on parameters and both moments after 4 steps: the per-parameter loop and the
    multi-tensor kernels do the same elementwise operations in the same order."""
    cfg = dict(lr=3e-3)  # every step moves every weight by ~lr, far above float32 resolution
    multi = run_steps(tiny_config(char_data, optimizer_foreach=True, **cfg), steps=4)
    loop = run_steps(tiny_config(char_data, optimizer_foreach=False, **cfg), steps=4)
    assert [g["foreach"] for g in loop.optimizer.param_groups] == [False, False]
    assert [g["foreach"] for g in multi.optimizer.param_groups] == [True, True]
    assert [g["weight_decay"] for g in loop.optimizer.param_groups] == [0.1, 0.0]  # both groups in play
    report("AdamW for-loop vs foreach parameters after 4 steps", full_params(loop.raw), full_params(multi.raw))
    torch.testing.assert_close(full_params(loop.raw), full_params(multi.raw), rtol=0, atol=0)
    for p_loop, p_multi in zip(loop.raw.parameters(), multi.raw.parameters()):
        s_loop, s_multi = loop.optimizer.state[p_loop], multi.optimizer.state[p_multi]
        torch.testing.assert_close(s_loop["exp_avg"], s_multi["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(s_loop["exp_avg_sq"], s_multi["exp_avg_sq"], rtol=0, atol=0)
    assert loop.losses == multi.losses


# ---- DataLoader workers (speed_2) and pinned memory / non_blocking (speed_3) -----------------------------


@pytest.fixture(scope="module")
def gpt2_text_data(tmp_path_factory, shakespeare_excerpt):
    """The CPU speed profile's kind of data: raw text, cleaned and BPE-tokenised per sample."""
    out = tmp_path_factory.mktemp("equivalence") / "excerpt_gpt2"
    return load_prepare_module().prepare(
        source="files", files=[str(shakespeare_excerpt)], tokenizer="gpt2", out=str(out)
    )


def loader_batches(cfg: TrainConfig, steps: int) -> list:
    dataset = make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size)
    sampler = WindowSampler(len(dataset), cfg.batch_size, steps, cfg.seed)
    loader = make_loader(dataset, sampler, cfg, CPU)
    assert loader.num_workers == cfg.num_workers
    batches = [to_device(b, CPU, cfg) for b in loader]
    del loader  # persistent workers exit with their loader
    return batches


@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes")  # 2 cores here
def test_num_workers_4_yields_the_batches_of_num_workers_0(gpt2_text_data):
    """Tolerance 0 (torch.equal): each sample depends only on its index, and the DataLoader hands the
    workers' batches back in sampler order."""
    cfg = dict(dataset="raw_text", block_size=64, batch_size=8)
    inline = loader_batches(tiny_config(gpt2_text_data, num_workers=0, **cfg), steps=6)
    workers = loader_batches(tiny_config(gpt2_text_data, num_workers=4, **cfg), steps=6)
    assert len(inline) == len(workers) == 6
    for (x0, y0), (x4, y4) in zip(inline, workers):
        assert torch.equal(x4, x0) and torch.equal(y4, y0)


class CopySpy:
    """Stands in for a batch tensor: records the arguments of its .to() (a CPU-only build cannot copy to CUDA)."""

    def __init__(self):
        self.calls = []

    def to(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self


def test_pinned_memory_and_non_blocking_copies_are_asked_for_on_cuda_only(char_data):
    """What speed_3 changes, checked without a GPU: its loader pins batches and its copies are non_blocking where
    the device is CUDA, and neither happens on a CPU (no copy to overlap; pinning would only warn). Its
    mathematics needs no check (a copy is a copy): on the CPU the stage runs the same code as its parent, and the
    pinned copies themselves are compared on CUDA in tests/test_gpu.py."""
    pinned, pageable = tiny_config(char_data, pin_memory=True), tiny_config(char_data, pin_memory=False)
    dataset = make_dataset(pinned.dataset, pinned.data_dir, pinned.block_size)
    cuda = torch.device("cuda")  # DataLoader pins only when iterated: building it needs no GPU
    for cfg, device, expected in ((pinned, cuda, True), (pageable, cuda, False), (pinned, CPU, False)):
        assert make_loader(dataset, WindowSampler(len(dataset), 8, 1, 0), cfg, device).pin_memory == expected
        batch = (CopySpy(), CopySpy())
        assert to_device(batch, device, cfg) == batch
        assert [t.calls for t in batch] == [[((device,), {"non_blocking": expected})]] * 2, (cfg.pin_memory, device)


# ---- torch.compile (speed_4) -----------------------------------------------------------------------------

# Inductor fuses layer norm, softmax, GELU and the loss into generated, vectorised C++ loops that reduce
# in their own order: float32 reassociation, ~1e-7 relative per reduction. Measured: losses equal,
# gradients within ~1e-7 absolute (6e-7 of the largest), using <5% of the bound: the margin is for
# other CPUs' vector widths. Dropout 0: compiled code draws its masks from another RNG sequence.
COMPILE_LOSS_RTOL = 1e-5
COMPILE_GRAD_RTOL, COMPILE_GRAD_ATOL = 1e-5, 1e-6


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")  # inside torch's inductor import
def test_compile_matches_eager(char_data):
    from torch._dynamo.utils import counters

    eager, grads_eager = train_with_grads(tiny_config(char_data), 2)
    counters.clear()
    compiled, grads_compiled = train_with_grads(tiny_config(char_data, compile=True), 2)
    # really compiled: a wrapper alone (hasattr _orig_mod) is also what dynamo leaves when it falls back to eager
    assert (
        counters["stats"]["unique_graphs"] >= 1
        and counters["inductor"]["fxgraph_cache_miss"] + counters["inductor"]["fxgraph_cache_hit"] >= 1
    ), dict(counters["stats"])
    print(f"\ncompile vs eager losses: {compiled.losses} vs {eager.losses}")
    assert compiled.losses == pytest.approx(eager.losses, rel=COMPILE_LOSS_RTOL)
    for step, (gc, ge) in enumerate(zip(grads_compiled, grads_eager)):
        report(f"compile vs eager, step {step + 1} gradients", gc, ge, COMPILE_GRAD_RTOL, COMPILE_GRAD_ATOL)
        torch.testing.assert_close(gc, ge, rtol=COMPILE_GRAD_RTOL, atol=COMPILE_GRAD_ATOL)


# ---- mixed precision (speed_5) ---------------------------------------------------------------------------

# bf16 keeps 8 significant bits: every matmul output is rounded by up to 2^-8 ~ 0.4% relative (half its spacing). The
# loss itself is fp32 (gpt/model.py upcasts the logits), so it moves by the logits' rounding errors,
# which mostly cancel in the mean over the 8 x 16 positions: measured ~1.3e-4 over 8 steps. The bound,
# 2e-3, leaves 15x; it is small next to what 8 steps at lr 3e-3 change the loss by (asserted), and a
# loss computed in bf16 itself (spacing 2^-6 ~ 0.016 near 4) would typically break it.
AMP_LOSS_ATOL = 2e-3


def test_bf16_autocast_loss_tracks_fp32(char_data):
    cfg = dict(lr=3e-3)
    # The CPU's autocast where bf16 is the faster dtype; whether it is, is measured per CPU (speed_5's rule,
    # tested in tests/test_beyond_equivalence.py), so the maths is checked in bf16 on every CPU.
    amp = MixedPrecision(torch.bfloat16, "cpu", None)
    fp32 = run_steps(tiny_config(char_data, **cfg), steps=8)
    bf16 = run_steps(tiny_config(char_data, amp=True, **cfg), steps=8, amp=amp)
    with torch.no_grad(), amp.autocast():  # the matmuls really ran in bf16
        assert bf16.model(bf16.inputs[0])[0].dtype == torch.bfloat16
    diffs = [abs(a - b) for a, b in zip(bf16.losses, fp32.losses)]
    print(
        f"\nbf16 vs fp32 losses: {[round(x, 4) for x in bf16.losses]} vs {[round(x, 4) for x in fp32.losses]}; "
        f"max |diff| {max(diffs):.3g}"
    )
    assert max(diffs) < AMP_LOSS_ATOL
    assert fp32.losses[0] - fp32.losses[-1] > 5 * AMP_LOSS_ATOL  # the tolerance is small next to learning


# ---- fp16 + GradScaler (speed_5 on CUDA), forced on the CPU ----------------------------------------------

# On CUDA, speed_5 runs fp16 autocast with a GradScaler; the CPU picks bf16 (gpt/optimizations/precision.py:
# mixed_precision), so these tests build the CUDA choice themselves and run it through train_step on the
# CPU, whose build has fp16 autocast and GradScaler("cpu"). fp16 keeps 11 significant bits (bf16: 8), so each
# matmul output is rounded by up to 2^-11 ~ 5e-4 relative. First-step gradients (same weights, clipping off
# so that a wrong scale could not be hidden by it): measured max |diff| 6.1e-4 of each tensor's largest
# value; the bound, 2e-3, is broken by bf16 (measured 4.6e-3) and by gradients left scaled (x65536). Losses
# over 8 steps with accumulation x2: measured 8.4e-5; bound 5e-4. (AdamW divides by the gradients' own size,
# so the losses alone would not see a wrong scale: the gradients are the check of the scaler.)
FP16_GRAD_RTOL = 2e-3
FP16_LOSS_ATOL = 5e-4


def fp16_with_scaler(**scaler_args) -> MixedPrecision:
    return MixedPrecision(torch.float16, "cpu", torch.amp.GradScaler("cpu", **scaler_args))


def test_fp16_with_grad_scaler_and_accumulation_tracks_fp32(char_data):
    check_fp16_tracks_fp32(char_data, fp16_with_scaler())


def check_fp16_tracks_fp32(char_data, amp: MixedPrecision, device: str = "cpu") -> None:
    """Also run on a GPU by tests/test_gpu.py, with the amp mixed_precision chooses there."""
    cfg = dict(lr=3e-3, batch_size=16, grad_accum_steps=2, grad_clip=NO_CLIP, device=device)
    fp32, grads_fp32 = train_with_grads(tiny_config(char_data, **cfg), 8)
    fp16, grads_fp16 = train_with_grads(tiny_config(char_data, **cfg), 8, amp=amp)
    with torch.no_grad(), amp.autocast():  # the matmuls really ran in fp16
        assert fp16.model(fp16.inputs[0])[0].dtype == torch.float16
    assert amp.scaler.get_scale() == 2.0**16  # the default scale never overflowed: every step was applied
    report("fp16 + scaler vs fp32, step 1 gradients", grads_fp16[0], grads_fp32[0])
    assert max_diff(grads_fp16[0], grads_fp32[0])[1] < FP16_GRAD_RTOL
    diffs = [abs(a - b) for a, b in zip(fp16.losses, fp32.losses)]
    print(f"fp16 + scaler vs fp32 losses over 8 steps: max |diff| {max(diffs):.3g}")
    assert all(math.isfinite(loss) for loss in fp16.losses) and max(diffs) < FP16_LOSS_ATOL
    assert fp32.losses[0] - fp32.losses[-1] > 100 * FP16_LOSS_ATOL  # the tolerance is small next to learning


def test_grad_scaler_skips_a_step_with_inf_gradients_and_halves_its_scale(char_data):
    """GradScaler's documented rule: after `growth_interval` steps without inf/NaN gradients the scale is
    multiplied by growth_factor (2); a step whose gradients hold an inf is skipped (parameters and AdamW's
    state untouched) and the scale multiplied by backoff_factor (0.5)."""
    cfg = tiny_config(char_data, lr=3e-3, batch_size=16, grad_accum_steps=2)
    batches = loader_batches(cfg, steps=4)
    raw, model, optimizer = build_model(cfg, make_dataset(cfg.dataset, cfg.data_dir, cfg.block_size).vocab_size, CPU)
    amp = fp16_with_scaler(init_scale=2.0**10, growth_interval=2)
    poisoned = raw.transformer.h[0].mlp.c_fc.weight
    scales, applied = [], []
    for step, (x, y) in enumerate(batches):
        before = {
            **full_params(raw),
            **{f"exp_avg {i}": s["exp_avg"].clone() for i, s in enumerate(optimizer.state.values())},
        }
        hook = poisoned.register_hook(lambda g: torch.full_like(g, float("inf"))) if step == 2 else None
        loss = train_step(model, optimizer, x, y, cfg, amp)
        if hook:
            hook.remove()
        after = {**full_params(raw), **{f"exp_avg {i}": s["exp_avg"] for i, s in enumerate(optimizer.state.values())}}
        assert math.isfinite(loss.item())  # the loss is fine: only the injected gradient is not
        scales.append(amp.scaler.get_scale())
        applied.append(any(not torch.equal(after[k], v) for k, v in before.items()))
    assert applied == [True, True, False, True]
    assert scales == [2.0**10, 2.0**11, 2.0**10, 2.0**10]  # grown after 2 good steps, halved by the inf one


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
    """Kill torchrun and its ranks. The ranks run in sessions of their own (torchrun starts them so), so
    killing torchrun's process group would orphan them: collect their ids from /proc first."""

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


def check_two_processes_match_one(mode, stage_settings, char_data, tmp_path, device, grad_tol, param_tol) -> None:
    """Also run on 2 GPUs (NCCL) by tests/test_gpu.py. Tolerances are (rtol, atol)."""
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
    launch_workers(cfg, DIST_STEPS, tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in range(NPROC)]
    single, grads_single = train_with_grads(
        tiny_config(char_data, batch_size=NPROC * RANK_BATCH, device=device, grad_clip=NO_CLIP), DIST_STEPS
    )
    grads_single = [{k: g.cpu() for k, g in grads.items()} for grads in grads_single]
    params_single = {k: p.cpu() for k, p in full_params(single.raw).items()}

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


@pytest.mark.parametrize("mode, stage_settings", [("ddp", dict(grad_accum_steps=2)), ("fsdp", {})])
def test_ranks_gradients_summed_not_averaged_fail_that_comparison(mode, stage_settings, char_data, tmp_path):
    """Negative control: a reduction that sums the ranks' gradients (each W = 2 times too large) is rejected by
    the gradient comparison above, which clipping would have passed."""
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
    """Without a mesh, fully_shard builds one on the machine's accelerator (a CPU stage would move to cuda:0
    on a machine with a GPU). parallelize passes its own, so fully_shard's default must never be built."""
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
    """NPROC ranks, this process rank 0, and no collective that really runs (torch's "fake" backend): enough to
    build a stage's FSDP units in the test process."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # importing it registers "fake"

    torch.distributed.init_process_group("fake", rank=0, world_size=NPROC, store=FakeStore())
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def fsdp_units(raw) -> list:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in raw.modules() if isinstance(m, FSDPModule)]

"""The chunked linear + cross-entropy (gpt/optimizations/chunked_loss.py, fast_6 and lean_2) matches the full loss.

It matches in fp32, and under bf16 as closely as the full loss does. Also which implementation computes it, the glue
around the two Triton kernels (liger, Cut Cross-Entropy), and where a run for time keeps the full loss instead. On the
CPU, through the project's own code (tests/equivalence.py); on CUDA in tests/test_gpu.py."""

import dataclasses
import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import needs_torch_chunked_loss
from equivalence import CPU, NO_CLIP, built_model_config, max_diff, report, tiny_config, train_with_grads

from gpt.errors import UserError
from gpt.ladder import stage_config
from gpt.optimizations import chunked_loss, owner, why_cannot_run

# ---- chunked linear + cross-entropy (fast_6, lean_2) --------------------------------------------------------

# The chunked op sums the loss chunk by chunk and accumulates the head's weight gradient over chunks: the
# same sums in another order. Measured (fp32): losses within ~2e-7 relative, gradients within ~1e-7 absolute
# (<2e-6 of the largest).
CHUNK_RTOL, CHUNK_ATOL = 1e-5, 1e-7


# The chunked op adds each chunk's weight gradient into a buffer of the input's dtype (bf16 under autocast), on the
# CPU and on CUDA alike: the more chunks, the further from fp32. At fast_6's reference shape (128 chunks) its
# relative difference from fp32 was 2.6e-2 against 3.4e-3 for the bf16 full loss: the bound for the chunked loss's
# extra difference (test_bf16_chunked_weight_gradient_at_the_stages_shape measures it).
BF16_CHUNKED_WEIGHT_GRAD = 3e-2


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 16 rows, the chunked path pinned; returns the spy's calls (each call's chunk size).

    The tests' 8 x 16 = 128 rows per step are 8 chunks. A run for time on a CPU (tiny_config's goal) keeps the loss
    measured faster at its shape (chunked_loss.loss_used): on this CPU the full one, so without the pin both sides would
    compute the full loss, and the spy would count the measurement's own calls."""
    monkeypatch.setattr(chunked_loss, "LOSS_CHUNK_ROWS", 16)
    monkeypatch.setattr(chunked_loss, "measured_loss_choice", lambda cfg, vocab_size, device_type: ("chunked", None))
    monkeypatch.setattr(chunked_loss, "time_head_and_loss", None)  # nothing measures: every call is training's
    calls = []
    real = torch.nn.functional.linear_cross_entropy

    @functools.wraps(real)  # the op's signature: chunked_loss.installed("torch") checks it
    def spy(*args, **kwargs):
        calls.append(kwargs["options"].batch_chunk_size)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", spy)
    return calls


@needs_torch_chunked_loss
@pytest.mark.parametrize("vocab_multiple", [1, 64])
def test_chunked_loss_matches_the_full_loss(small_chunks, char_data, vocab_multiple):
    full, grads_full = train_with_grads(tiny_config(char_data, vocab_multiple=vocab_multiple), 2)
    chunked, grads_chunked = train_with_grads(tiny_config(char_data, vocab_multiple=vocab_multiple, loss="chunked"), 2)
    assert chunked.gpt.config.loss == "chunked" and full.gpt.config.loss == "full"
    assert small_chunks == [16, 16]  # the chunked op ran in the model, once per step, 8 chunks per call
    assert chunked.losses == pytest.approx(full.losses, rel=CHUNK_RTOL)
    for step, (gc, gf) in enumerate(zip(grads_chunked, grads_full)):
        report(
            f"chunked vs full loss (vocab_multiple {vocab_multiple}), step {step + 1} gradients",
            gc,
            gf,
            CHUNK_RTOL,
            CHUNK_ATOL,
        )
        torch.testing.assert_close(gc, gf, rtol=CHUNK_RTOL, atol=CHUNK_ATOL)


@pytest.mark.parametrize("vocab_multiple", [1, 64])
def test_the_plain_chunked_loss_trains_the_full_losss_model(monkeypatch, char_data, vocab_multiple):
    """The plain chunked loss in the model trains as the full loss does: the same losses and gradients, two steps.

    loss_impl="plain" (what a torch without PyTorch's op, say 2.11, resolves to), 8 chunks a step, within the same
    summation-order tolerance as PyTorch's op (CHUNK_RTOL, CHUNK_ATOL)."""
    monkeypatch.setattr(chunked_loss, "LOSS_CHUNK_ROWS", 16)
    full, grads_full = train_with_grads(tiny_config(char_data, vocab_multiple=vocab_multiple), 2)
    cfg = tiny_config(char_data, vocab_multiple=vocab_multiple, loss="chunked", loss_impl="plain")
    plain, grads_plain = train_with_grads(cfg, 2)
    assert plain.gpt.config.loss == "chunked" and plain.gpt.config.loss_impl == "plain"
    assert plain.losses == pytest.approx(full.losses, rel=CHUNK_RTOL)
    for gp, gf in zip(grads_plain, grads_full):
        torch.testing.assert_close(gp, gf, rtol=CHUNK_RTOL, atol=CHUNK_ATOL)


@needs_torch_chunked_loss
def test_chunked_loss_under_bf16_autocast_tracks_fp32_as_closely_as_the_full_loss(small_chunks, monkeypatch, char_data):
    """Under bf16 autocast the chunked loss tracks fp32 as closely as the full loss does.

    Under bf16 autocast both losses multiply in bf16; the full loss then computes its softmax in fp32, the chunked op
    (on a CPU) in the inputs' dtype, and it returns the loss in bf16, summed over chunks in bf16. So: gradients as close
    to fp32 training as the full loss's are (bound: twice the full loss's difference plus BF16_CHUNKED_WEIGHT_GRAD of
    the largest gradient; measured ~7e-3 for both here), and the loss within its bf16 summation error (n_chunks
    half-ulps, 2^-9 relative each)."""
    rates = {torch.bfloat16: 2.0, torch.float32: 1.0}
    monkeypatch.setattr("gpt.flops.measure_cpu_matmul_rates_in_turns", lambda dtypes, n: (n, rates))
    cfg = dict(grad_clip=NO_CLIP)
    fp32, grads_fp32 = train_with_grads(tiny_config(char_data, **cfg), 1)
    full, grads_full = train_with_grads(tiny_config(char_data, amp=True, **cfg), 1)
    chunked, grads_chunked = train_with_grads(tiny_config(char_data, amp=True, loss="chunked", **cfg), 1)
    assert chunked.gpt.config.loss == "chunked" and small_chunks == [16]
    n_chunks = 8 * 16 // small_chunks[0]
    full_rel, chunked_rel = max_diff(grads_full[0], grads_fp32[0])[1], max_diff(grads_chunked[0], grads_fp32[0])[1]
    print(
        f"\nbf16 vs fp32 gradients, max |diff| / max |value|: full loss {full_rel:.3g}, chunked {chunked_rel:.3g}; "
        f"losses: fp32 {fp32.losses[0]:.5f}, full {full.losses[0]:.5f}, chunked {chunked.losses[0]:.5f}"
    )
    assert chunked_rel < 2 * full_rel + BF16_CHUNKED_WEIGHT_GRAD
    assert chunked.losses[0] == pytest.approx(fp32.losses[0], rel=n_chunks * 2**-9 + 2e-3)


U32 = 2.0**-24  # fp32's unit roundoff


def head_and_loss(impl: str, x, weight, bias, targets, vocab: int, dtype=torch.float64):
    """The loss and the gradients of x and of the weight, from the full loss ("full") or a chunked one, in `dtype`."""
    x, weight = (t.detach().to(dtype).requires_grad_() for t in (x, weight))
    if impl == "full":
        loss = chunked_loss.full_cross_entropy(x, weight, targets, vocab, bias.to(dtype))
    else:
        loss = chunked_loss.chunked_cross_entropy(x, weight, targets, vocab, bias.to(dtype), impl=impl)
    loss.backward()
    return [t.detach().double() for t in (loss, x.grad, weight.grad)]


def test_the_plain_chunked_loss_gives_the_full_loss_and_gradients_within_fp32s_rounding(monkeypatch):
    """The plain-PyTorch chunked loss in fp32 is the loss's mathematics: within a bound derived from fp32's rounding.

    Against the exact result (float64), element by element, with u = 2^-24 and the first-order bound of a sum of n
    terms, |error| <= n u sum|terms|. A logit sums `dim` products, so is off by at most dz = dim u (|x| |W|^T); a row's
    loss, lse - z_target, moves by at most 2 dz plus the log-sum-exp's own rounding, (vocab + 2) u max(|lse|, 1); the
    mean over N rows adds N u of its mean magnitude. A row's logit gradient (softmax - one-hot) / N moves by at most
    (4 dz + (vocab + 4) u) times its softmax / N (exp is 1-Lipschitz in relative terms); the gradients of x and of
    the weight add their own matmul's rounding, vocab u (|G| |W|) and N u (|G|^T |x|). The same bound holds the full
    loss in fp32 (checked too, so that the bound is one that fp32 arithmetic meets) and is at most 1e-4 of each
    quantity (so that a wrong gradient cannot hide in it). 61 rows in chunks of 16 (the last short), a padded
    vocabulary (65 of 128 rows). Seen failing with the weight gradient of the last chunk only (`=` for `+=`), and with
    0.999 for the one-hot's 1."""
    monkeypatch.setattr(chunked_loss, "LOSS_CHUNK_ROWS", 16)
    g = torch.Generator().manual_seed(0)
    rows, dim, vocab, padded = 61, 32, 65, 128
    x, weight = torch.randn(rows, dim, generator=g), 0.3 * torch.randn(padded, dim, generator=g)
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    targets = torch.randint(vocab, (rows,), generator=g)
    exact = head_and_loss("full", x, weight, bias, targets, vocab)

    xa, wa = x.double().abs(), weight.double().abs()
    z = x.double() @ weight.double().T + bias.double()
    p = torch.softmax(z, dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    dz = (dim * U32 * (xa @ wa.T))[:, :vocab].max(dim=-1).values  # a row's largest logit error
    row_loss = 2 * dz + (vocab + 2) * U32 * lse.abs().clamp_min(1)
    loss_bound = row_loss.mean() + rows * U32 * exact[0].abs()
    grad_logits = (p - torch.nn.functional.one_hot(targets, padded)).abs() / rows
    d_grad_logits = (4 * dz + (vocab + 4) * U32)[:, None] * p / rows
    x_bound = d_grad_logits @ wa + vocab * U32 * (grad_logits @ wa)
    w_bound = d_grad_logits.T @ xa + rows * U32 * (grad_logits.T @ xa)

    for impl in ("plain", "full"):
        loss, grad_x, grad_w = head_and_loss(impl, x, weight, bias, targets, vocab, torch.float32)
        assert (loss - exact[0]).abs() <= loss_bound, impl
        assert ((grad_x - exact[1]).abs() <= x_bound).all(), impl
        assert ((grad_w - exact[2]).abs() <= w_bound).all(), impl
    assert loss_bound <= 1e-4 * exact[0].abs()
    assert x_bound.max() <= 1e-4 * exact[1].abs().max() and w_bound.max() <= 1e-4 * exact[2].abs().max()


def test_the_plain_chunked_loss_under_bf16_autocast_is_the_full_loss_but_for_the_weight_gradients_sum():
    """Under bf16 autocast the plain chunked loss computes the full loss's logits and softmax, row by row, as it does.

    Both round the logits to bf16 and take the softmax in fp32: the loss and the gradient of x come out the same to
    the bit. The weight's gradient is a sum over rows: the full loss's matmul rounds it to bf16 once, the chunked one
    rounds each chunk's part and sums them in fp32, so they differ by at most one bf16 rounding (2^-9 relative) per
    chunk of each element's magnitude, here 4 chunks (61 rows by 16)."""
    g = torch.Generator().manual_seed(1)
    rows, dim, vocab = 61, 32, 65
    x, weight = torch.randn(rows, dim, generator=g), 0.3 * torch.randn(vocab, dim, generator=g)
    targets = torch.randint(vocab, (rows,), generator=g)
    out = {}
    for impl in ("full", "plain"):
        xi, wi = (t.clone().requires_grad_() for t in (x, weight))
        with torch.autocast("cpu", dtype=torch.bfloat16), mock.patch.object(chunked_loss, "LOSS_CHUNK_ROWS", 16):
            fn = (
                chunked_loss.full_cross_entropy
                if impl == "full"
                else functools.partial(chunked_loss.chunked_cross_entropy, impl="plain")
            )
            loss = fn(xi, wi, targets, vocab)
        loss.backward()
        out[impl] = (loss.detach(), xi.grad, wi.grad)
    (loss_f, gx_f, gw_f), (loss_p, gx_p, gw_p) = out["full"], out["plain"]
    assert loss_p.dtype == torch.float32 and torch.equal(loss_p, loss_f) and torch.equal(gx_p, gx_f)
    chunks = -(-rows // 16)
    rows_part = (gw_f.abs() + gw_p.abs()).max()
    assert (gw_p - gw_f).abs().max() <= chunks * 2**-9 * rows_part


# Which implementation computes the chunked loss (gpt/optimizations/chunked_loss.py), and the glue around the two
# that need Triton (CUDA only): each gets its inputs as the chunked op's contract says. A stand-in with the library's
# signature computes what the library documents (below), so the glue must reproduce the full loss exactly (same ops,
# same order).


def fake_module(monkeypatch, name: str, **attributes):
    """A module importable as `name` (find_spec included) with the given attributes."""
    import importlib.machinery
    import types

    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        module = types.ModuleType(".".join(parts[:i]))
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        monkeypatch.setitem(sys.modules, module.__name__, module)
    for key, value in attributes.items():
        setattr(sys.modules[name], key, value)


def test_chunked_loss_implementation_follows_what_is_installed(monkeypatch):
    """The chunked loss's implementation follows what is installed.

    auto: PyTorch's own op where it exists (2.12 and newer), else liger, else Cut Cross-Entropy, both on CUDA only,
    else plain PyTorch's chunks; a named implementation that is missing says what to install."""

    def skip_reason(stage):
        return why_cannot_run(stage_config(stage, "smoke", device="cpu"), "cpu")

    installed = set()  # the libraries this test says are installed, whatever this machine has
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in installed else None)

    def op(input, linear_weight, target, *, linear_bias=None, options=None): ...  # the signature called

    # PyTorch 2.12's op and its options, whatever torch runs the test (2.11 has neither)
    options = dataclasses.make_dataclass("LinearCrossEntropyOptions", sorted(chunked_loss.OPTIONS_SET))
    monkeypatch.setattr(torch.nn, "LinearCrossEntropyOptions", options, raising=False)
    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", op, raising=False)
    assert chunked_loss.resolve("auto", "cpu") == chunked_loss.resolve("auto", "cuda") == "torch"
    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy")  # as in torch 2.11
    assert chunked_loss.resolve("auto", "cpu") == chunked_loss.resolve("auto", "cuda") == "plain"
    with pytest.raises(UserError, match="on a cpu needs PyTorch 2.12 or newer|'torch' needs PyTorch 2.12 or newer"):
        chunked_loss.resolve("torch", "cpu")
    with pytest.raises(UserError, match="`pip install cut-cross-entropy`"):
        chunked_loss.resolve("cce", "cuda")
    assert skip_reason("lean_2_chunked_loss") is None  # plain PyTorch's chunks
    assert skip_reason("fast_6_chunked_loss") is None
    assert skip_reason("fast_5_fused_adamw") is None
    installed.add("cut_cross_entropy")
    assert chunked_loss.resolve("auto", "cuda") == "cce"
    assert chunked_loss.why_unavailable("cce", "cpu") == "the chunked loss 'cce' runs on CUDA only (Triton kernels)"
    installed.add("liger_kernel")
    assert chunked_loss.resolve("auto", "cuda") == "liger" and chunked_loss.resolve("cce", "cuda") == "cce"


# Stand-ins for the two Triton kernels: each library's own signature (liger-kernel 0.8.5,
# liger_kernel/transformers/functional.py; cut-cross-entropy 25.1.1, cut_cross_entropy/linear_cross_entropy.py),
# computing what it documents, so that the glue's mistakes change the loss: logits = input @ weight.T (+ bias; weight
# is (vocab, dim)) in the inputs' dtype, which must match (a Triton kernel is not reached by autocast, so the stand-in
# turns it off), soft-capped, then fp32 cross-entropy with ignore_index and the reduction (liger: class weights, label
# smoothing, z-loss; cce: shift, the next row's target). What they cannot show on a CPU, the rounding that liger's
# accum_dtype and cce's gradient filter change, is recorded and checked as given.


def kernel_contract(
    x,
    weight,
    targets,
    bias=None,
    *,
    ignore_index,
    reduction,
    softcap,
    ce_weight=None,
    label_smoothing=0.0,
    lse_square_scale=0.0,
):
    assert x.dim() == 2 and targets.shape == x.shape[:1] and weight.shape[1] == x.shape[1]
    with torch.autocast(x.device.type, enabled=False):
        logits = torch.nn.functional.linear(x, weight, bias)  # raises unless x, weight and bias share a dtype
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits.float()
    loss = torch.nn.functional.cross_entropy(
        logits,
        targets,
        weight=ce_weight,
        ignore_index=ignore_index,
        reduction=reduction,
        label_smoothing=label_smoothing,
    )
    if lse_square_scale:
        z = lse_square_scale * torch.logsumexp(logits, -1)[targets != ignore_index] ** 2
        loss = loss + {"mean": z.mean(), "sum": z.sum()}[reduction]
    return loss


def stand_ins(monkeypatch) -> dict:
    """Both libraries importable, with the stand-ins; returns what the precision-only arguments were given."""
    seen = {}

    def liger_fused_linear_cross_entropy(
        input,
        weight,
        target,
        bias=None,
        ce_weight=None,
        ignore_index=-100,
        lse_square_scale=0.0,
        label_smoothing=0.0,
        reduction="mean",
        softcap=None,
        return_z_loss=False,
        accum_dtype=None,
        use_token_scaling=False,
        return_token_accuracy=False,
        return_predicted_tokens=False,
        chunk_mem_const=1,
    ):
        assert not (return_z_loss or use_token_scaling or return_token_accuracy or return_predicted_tokens)  # a tuple
        seen.update(accum_dtype=accum_dtype)
        return kernel_contract(
            input,
            weight,
            target,
            bias,
            ignore_index=ignore_index,
            reduction=reduction,
            softcap=softcap,
            ce_weight=ce_weight,
            label_smoothing=label_smoothing,
            lse_square_scale=lse_square_scale,
        )

    def linear_cross_entropy(
        e, c, targets, ignore_index=-100, softcap=None, reduction="mean", shift=False, filter_eps="high", impl="cce"
    ):
        seen.update(filter_eps=filter_eps, impl=impl)
        if shift:
            e, targets = e[:-1], targets[1:]
        return kernel_contract(e, c, targets, ignore_index=ignore_index, reduction=reduction, softcap=softcap)

    fake_module(
        monkeypatch,
        "liger_kernel.transformers.functional",
        liger_fused_linear_cross_entropy=liger_fused_linear_cross_entropy,
    )
    fake_module(monkeypatch, "cut_cross_entropy", linear_cross_entropy=linear_cross_entropy)
    return seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("impl", ["liger", "cce"])
def test_triton_chunked_losses_get_the_padded_head_as_their_contract_says(impl, dtype, monkeypatch):
    """The Triton chunked losses get the padded head as their contracts say.

    liger takes the -inf padding bias (and fp32 weight-gradient accumulation); Cut Cross-Entropy takes no bias, so it
    gets the real rows only, with its gradient filtering off; under autocast both get the autocast dtype's inputs, bias
    included. Either way: the full loss of the padded head, as the model computes it under the same autocast, its
    gradients to the bit, and gradient 0 for the padding rows."""
    seen = stand_ins(monkeypatch)
    vocab, padded = 80, 128
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 32, generator=g, requires_grad=True)
    weight = torch.randn(padded, 32, generator=g)
    weight[vocab:] = 0  # as the model keeps its padding rows
    weight.requires_grad_()
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    targets = torch.randint(vocab, (64,), generator=g)
    targets[::8] = -100  # ignored by the full loss (F.cross_entropy's default ignore_index): by the kernels too
    x_ref, w_ref = x.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        loss = chunked_loss.chunked_cross_entropy(x, weight, targets, vocab, bias, impl=impl)
        reference = chunked_loss.full_cross_entropy(x_ref, w_ref, targets, vocab, bias)
    loss.backward()
    reference.backward()
    assert loss.item() == reference.item()
    assert torch.equal(x.grad, x_ref.grad) and torch.equal(weight.grad, w_ref.grad)
    assert weight.grad[vocab:].abs().max() == 0
    assert seen == (dict(accum_dtype=torch.float32) if impl == "liger" else dict(filter_eps=None, impl="cce"))


@pytest.mark.parametrize("impl", ["liger", "cce"])
def test_triton_chunked_losses_run_outside_torch_compile(impl, monkeypatch):
    """The Triton chunked losses run eagerly, outside torch.compile's tracing.

    fast_6 compiles its model, loss included, and Dynamo must not trace into the libraries' own autograd functions: on
    torch 2.11 it could not trace liger's (fake tensors fail on its torch.addmm(out_dtype=..., out=...): fast_6 died
    before its first step on an H100, tests/test_gpu.py::test_fast_stages_run_on_cuda). The stand-in records whether it
    ran under Dynamo's tracing; it must have run, and eagerly."""
    stand_ins(monkeypatch)
    module, name = {
        "liger": ("liger_kernel.transformers.functional", "liger_fused_linear_cross_entropy"),
        "cce": ("cut_cross_entropy", "linear_cross_entropy"),
    }[impl]
    kernel, traced = getattr(sys.modules[module], name), []

    def recording_kernel(*args, **kwargs):
        traced.append(torch.compiler.is_compiling())
        return kernel(*args, **kwargs)

    monkeypatch.setattr(sys.modules[module], name, recording_kernel)
    vocab, padded = 80, 128
    x, weight = torch.randn(64, 32, requires_grad=True), torch.randn(padded, 32, requires_grad=True)
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    torch._dynamo.reset()
    loss_fn = torch.compile(lambda *a: chunked_loss.chunked_cross_entropy(*a, impl=impl), backend="eager")
    loss_fn(x, weight, torch.randint(vocab, (64,)), vocab, bias).backward()
    assert traced == [False] and x.grad is not None


@pytest.mark.slow
def test_liger_kernels_match_the_full_loss_under_tritons_interpreter(char_data):
    """liger-kernel's real Triton kernels, run on the CPU by Triton's interpreter, match the full loss.

    Two training steps of a padded-vocabulary model with loss_impl="liger" give the full loss's losses and gradients
    (CHUNK_RTOL and CHUNK_ATOL). TRITON_INTERPRET must be set before Triton is imported, hence a subprocess. Needs
    liger-kernel and triton (`pip install liger-kernel`), skipped without them: the default suite's environment has
    neither, and Cut Cross-Entropy's kernels use a function the interpreter lacks (it is checked on CUDA,
    test_gpu.py)."""
    if importlib.util.find_spec("liger_kernel") is None or importlib.util.find_spec("triton") is None:
        pytest.skip("liger-kernel and triton are not installed (pip install liger-kernel)")
    script = f"""
import sys
import torch
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})  # tests/: equivalence.py and conftest.py
from equivalence import tiny_config, train_with_grads
from test_chunked_loss import CHUNK_ATOL, CHUNK_RTOL
full, grads_full = train_with_grads(tiny_config({str(char_data)!r}, vocab_multiple=64), 2)
liger, grads_liger = train_with_grads(tiny_config({str(char_data)!r}, vocab_multiple=64, loss="chunked",
                                                  loss_impl="liger"), 2)
assert liger.gpt.config.loss_impl == "liger"
assert liger.losses == __import__("pytest").approx(full.losses, rel=CHUNK_RTOL), (liger.losses, full.losses)
for gl, gf in zip(grads_liger, grads_full):
    torch.testing.assert_close(gl, gf, rtol=CHUNK_RTOL, atol=CHUNK_ATOL)
print("liger matches", liger.losses, full.losses)
"""
    r = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        env={**os.environ, "TRITON_INTERPRET": "1"},
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    print(r.stdout)


def test_loss_benchmark_times_the_full_loss_and_each_available_implementation(capsys):
    from gpt import bench_loss

    assert (
        bench_loss.main(
            [
                "--rows",
                "64",
                "--dim",
                "16",
                "--vocab",
                "80",
                "--repeats",
                "2",
                "--warmup",
                "0",
                "--device",
                "cpu",
                "--dtype",
                "float32",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "64 rows x 16 -> 80 classes (padded to 128)" in out and "\nfull " in out
    assert ("chunked (torch)" in out) == chunked_loss.installed("torch")
    assert "liger, cce\n" in out.split("not available here: ")[1]  # Triton kernels: CUDA only


def test_a_cpu_run_for_time_keeps_the_full_loss_where_the_chunked_one_was_measured_slower(char_data, monkeypatch):
    """A CPU run for time keeps the full loss where the chunked one was measured slower.

    fast_6's CPU rule, as fast_3's: the chunked loss only where its head and loss were measured faster than the full
    loss's at the stage's shape (at 65 characters its chunks only add work); a run for memory (the lean ladder) keeps it
    whatever the time, since its point there is the logits it never holds."""
    from gpt.optimizations import chunked_loss

    times = iter([{"median_ms": 2.0}, {"median_ms": 5.0}])
    monkeypatch.setattr(chunked_loss, "time_head_and_loss", lambda *a, **k: next(times))
    monkeypatch.setattr(chunked_loss, "resolve", lambda choice, device_type: "torch")
    monkeypatch.setattr(chunked_loss, "torch_op_takes_our_call", lambda: True)  # as on torch 2.12 and newer
    cfg = tiny_config(char_data, loss="chunked", block_size=12, samples=320)  # a shape of its own
    loss, why = chunked_loss.loss_used(cfg, "cpu", 65)
    assert loss == "full" and why.startswith("kept the full loss: the chunked loss (torch) is slower on this CPU")
    assert "96 rows x 32 -> 65 classes, float32: full 2.00 ms, chunked 5.00 ms" in why  # batch 8 x block 12
    assert owner("loss").no_effect(cfg, CPU) == why  # measured once, then read from the cache
    assert chunked_loss.loss_used(
        tiny_config(char_data, loss="chunked", block_size=12, samples=320, goal="memory"), "cpu", 65
    ) == ("chunked", None)
    assert built_model_config(cfg).loss == "full"
    # a GPU measures too, under its own name: there the chunked loss was measured faster
    times = iter([{"median_ms": 5.0}, {"median_ms": 2.0}])
    monkeypatch.setattr(chunked_loss, "device_label", lambda device: "GPU (H200)")
    assert chunked_loss.loss_used(cfg, "cuda", 65) == ("chunked", None)
    times = iter([{"median_ms": 2.0}, {"median_ms": 5.0}])
    other = tiny_config(char_data, loss="chunked", block_size=12, samples=320, batch_size=4)
    assert "slower on this GPU (H200) at this shape" in chunked_loss.loss_used(other, "cuda", 65)[1]


def test_a_vocabulary_no_wider_than_the_model_keeps_the_full_loss_by_rule_without_measuring(monkeypatch, tmp_path):
    """A vocabulary no wider than the model keeps the full loss by rule, and nothing is timed for it.

    The speedrun's 80 characters, padded to 128, against its 128-wide model: the rule's case. A model narrower than
    the padded vocabulary is measured as before, and the GPT-2 vocabulary of the fast ladder is never the rule's."""
    from gpt.model import GPTConfig
    from gpt.run_choices import model_choices

    timed = []
    monkeypatch.setattr(chunked_loss, "time_head_and_loss", lambda *a, **k: timed.append(a) or {"median_ms": 1.0})
    monkeypatch.setattr(chunked_loss, "resolve", lambda choice, device_type: "torch")
    monkeypatch.setattr(chunked_loss, "why_unavailable", lambda choice, device_type: None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing measured before
    cfg = stage_config("speedrun_20_untied_head", "cpu")
    assert (cfg.model_shape["n_embd"], chunked_loss.padded_vocabulary(cfg, 80)) == (128, 128)
    loss, why = chunked_loss.loss_used(cfg, "cpu", 80)
    assert loss == "full" and why.startswith("kept the full loss by rule: 128 logits a row")
    choices = model_choices(cfg, CPU, GPTConfig(vocab_size=80, vocab_multiple=cfg.vocab_multiple, loss="full"))
    assert choices["loss_how"] == "rule: the full loss where the logits are no wider than the model (128 <= 128)"
    assert chunked_loss.loss_used(cfg, "cuda", 80)[0] == "full" and timed == []  # on every device
    wider = stage_config("speedrun_20_untied_head", "cpu", n_embd=64)
    chunked_loss.loss_used(wider, "cpu", 80)
    assert len(timed) == 2 and chunked_loss.loss_how(wider, "cpu", 80) == "measured"  # full, then chunked
    assert chunked_loss.narrow_vocabulary_rule(stage_config("fast_6_chunked_loss", "cpu"), 50257) is None


def test_every_committed_measurement_the_narrow_vocabulary_rule_replaces_chose_the_full_loss():
    """Every committed record whose loss was measured where the rule now decides it measured the full loss faster.

    The rule's evidence, from every records/ folder: a record's model (its width, vocabulary and padding) and its
    choices (the loss that ran, how it was chosen, and the two timings); docs/design.md quotes the records' count, their
    folders and how much slower the chunked loss was (seen failing with 147 records typed)."""
    import json
    import re

    from gpt.committed_records import PUBLISHED

    measured, slower = {}, []
    for path in PUBLISHED.glob("*/**/*.json"):
        record = json.loads(path.read_text())
        model, choices = (record.get(key) or {} if isinstance(record, dict) else {} for key in ("model", "choices"))
        if choices.get("loss_how") != "measured" or "vocab_size" not in model:
            continue
        padded = -(-model["vocab_size"] // model["vocab_multiple"]) * model["vocab_multiple"]
        if padded <= model["n_embd"]:
            measured[path.relative_to(PUBLISHED)] = choices["loss"], choices["loss_why"]
            full, chunked = re.search(r"full ([\d.]+) ms, chunked ([\d.]+) ms", choices["loss_why"]).groups()
            slower.append(float(chunked) / float(full))
    assert len(measured) >= 20  # the speedrun's and the time to loss's records of every CPU run
    assert {loss for loss, _ in measured.values()} == {"full"}, measured
    assert all("slower on this CPU" in why for _, why in measured.values())
    folders = {path.parts[0] for path in measured}
    design = " ".join((PUBLISHED.parent / "docs" / "design.md").read_text().split())
    quoted = f"by {min(slower):.2f}-{max(slower):.2f}x ({len(measured)} records in {len(folders)} CPU folders)"
    assert quoted in design


def test_an_older_linear_cross_entropy_falls_back_instead_of_failing_the_stage(monkeypatch):
    """A torch with an older F.linear_cross_entropy falls back instead of failing the stage.

    F.linear_cross_entropy came into torch's history before its linear_bias= and options= (the call
    chunked_cross_entropy makes): a torch with the older function counts as one without it, so the stages fall back to
    liger / Cut Cross-Entropy on CUDA, else to plain PyTorch's chunks, instead of dying in a TypeError; one that names
    PyTorch's op is told why it cannot have it."""

    def older(input, linear_weight, target, bias=None, reduction="mean"): ...  # a stand-in of the older signature

    monkeypatch.setattr(torch.nn.functional, "linear_cross_entropy", older, raising=False)  # 2.11 has none
    assert not chunked_loss.installed("torch")
    assert why_cannot_run(stage_config("lean_2_chunked_loss", "smoke", device="cpu"), "cpu") is None
    assert chunked_loss.resolve("auto", "cpu") == chunked_loss.resolve("auto", "cuda") == "plain"
    reason = chunked_loss.why_unavailable("torch", "cpu")
    assert reason.startswith("the chunked loss 'torch' needs PyTorch 2.12") and "lacks linear_bias=" in reason
    fake_module(monkeypatch, "liger_kernel")
    assert chunked_loss.resolve("auto", "cuda") == "liger"


@needs_torch_chunked_loss
@pytest.mark.slow
def test_bf16_chunked_weight_gradient_at_the_stages_shape():
    """The bf16 chunked loss's head weight gradient stays close to fp32's at fast_6_chunked_loss's reference shape.

    Against fp32 at that shape (32768 rows x 192, vocabulary 65 padded to 128: 128 chunks of LOSS_CHUNK_ROWS), on random
    inputs: within BF16_CHUNKED_WEIGHT_GRAD more than the bf16 full loss's (measured 2.6e-2 and 3.4e-3 on this project's
    CPU)."""
    cfg, vocab = stage_config("fast_6_chunked_loss", "reference"), 65
    rows, dim = cfg.micro_batch_size * cfg.block_size, cfg.model_shape["n_embd"]
    padded = -(-vocab // cfg.vocab_multiple) * cfg.vocab_multiple
    g = torch.Generator().manual_seed(0)
    x, weight = torch.randn(rows, dim, generator=g), 0.02 * torch.randn(padded, dim, generator=g)
    bias = torch.zeros(padded)
    bias[vocab:] = float("-inf")
    targets = torch.randint(vocab, (rows,), generator=g)

    def weight_grad(loss_fn, dtype):
        w = weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss_fn(x.clone().requires_grad_(), w, targets, vocab, bias).backward()
        return {"weight": w.grad[:vocab]}

    fp32 = weight_grad(chunked_loss.full_cross_entropy, torch.float32)
    full_rel = max_diff(weight_grad(chunked_loss.full_cross_entropy, torch.bfloat16), fp32)[1]
    chunked = weight_grad(lambda *a: chunked_loss.chunked_cross_entropy(*a, impl="torch"), torch.bfloat16)
    chunked_rel = max_diff(chunked, fp32)[1]
    print(
        f"\nbf16 vs fp32 weight gradient at {rows} x {dim} -> {padded}: full {full_rel:.3g}, chunked {chunked_rel:.3g}"
    )
    assert chunked_rel < 2 * full_rel + BF16_CHUNKED_WEIGHT_GRAD

"""The chunked linear + cross-entropy (loss="chunked": fast_6, lean_2): the output head and the loss by chunks of rows.

The (rows x vocabulary) logits never exist at once. Four implementations, as this machine's torch and packages allow:

    torch   F.linear_cross_entropy (PyTorch 2.12 and newer), every device
    liger   liger-kernel's fused linear cross-entropy (Triton kernels; CUDA), `pip install liger-kernel`
    cce     Apple's Cut Cross-Entropy (Triton kernels; CUDA), `pip install cut-cross-entropy`
    plain   ChunkedLinearCrossEntropy below: plain PyTorch ops chunk by chunk; every torch and device, nothing to add

`loss_impl` "auto" takes the first of IMPLEMENTATIONS available on the device. All four give the full loss's loss
and gradients up to summation order: docs/design.md#beyond-the-book-the-fast-and-lean-ladders.
"""

import dataclasses
import importlib.util
import inspect
import statistics
import time

import torch
import torch.nn.functional as F

from gpt import machine_cache
from gpt.config import TrainConfig
from gpt.devices import device_label, synchronize
from gpt.errors import UserError
from gpt.optimizations.compilation import compile_mode, cuda_graphs_rule
from gpt.optimizations.optimization import Optimization, SimulationPlan
from gpt.optimizations.precision import mixed_precision

LOSSES = ("full", "chunked")  # the whole logits, then cross-entropy | chunk by chunk of rows
IMPLEMENTATIONS = ("torch", "liger", "cce", "plain")  # also the order of preference of "auto": fused kernels first
PACKAGES = {"liger": "liger-kernel", "cce": "cut-cross-entropy"}  # what to pip install for each
MODULES = {"liger": "liger_kernel", "cce": "cut_cross_entropy"}
TRITON_ONLY = ("liger", "cce")  # their kernels are Triton: CUDA (or Triton's interpreter, in a test)

LOSS_CACHE = "chunked_loss"  # gpt/machine_cache.py's file of measured head-and-loss times
LOSS_CHUNK_ROWS = 256  # rows of logits per chunk on a CPU: 256 x 50304 bf16 = 25 MiB, instead of B*T x 50304
OPTIONS_SET = {
    "batch_chunk_size",
    "chunking_method",
    "acc_policy",
}  # LinearCrossEntropyOptions' fields loss_chunking sets


def installed(name: str) -> bool:
    """Whether implementation `name` is there (PyTorch's own op, or the library)."""
    if name == "torch":
        return torch_op_takes_our_call()
    if name == "plain":
        return True
    check_impl(name)
    return importlib.util.find_spec(MODULES[name]) is not None


def torch_op_takes_our_call() -> bool:
    """Whether this torch's F.linear_cross_entropy takes the call chunked_cross_entropy makes (linear_bias=, options=).

    The name came into torch's history before these: asking for it alone would let an older torch fail the stage with a
    TypeError instead of falling back to liger / cce or skipping it."""
    op, options = getattr(F, "linear_cross_entropy", None), getattr(torch.nn, "LinearCrossEntropyOptions", None)
    if op is None or not dataclasses.is_dataclass(options):
        return False
    try:
        keywords = inspect.signature(op).parameters
    except (TypeError, ValueError):  # a builtin without a signature: not the Python op this module calls
        return False
    fields = {f.name for f in dataclasses.fields(options)}
    return {"linear_bias", "options"} <= keywords.keys() and OPTIONS_SET <= fields


def torch_op_needed() -> str:
    """What PyTorch's implementation needs, said of this torch (a reason to skip, or a one-line error)."""
    older = (
        ", whose F.linear_cross_entropy lacks linear_bias= or options=" if hasattr(F, "linear_cross_entropy") else ""
    )
    return f"PyTorch 2.12 or newer (this is {torch.__version__}{older})"


def available(name: str, device_type: str) -> bool:
    """Whether implementation `name` can run on `device_type` with what this machine has installed."""
    return installed(name) and (name not in TRITON_ONLY or device_type == "cuda")


def resolve(choice: str, device_type: str) -> str:
    """The implementation a run uses: `choice` ("auto": the first of IMPLEMENTATIONS available on the device).

    "auto" always finds one ("plain" runs everywhere); a UserError says what one asked for and missing needs."""
    if choice != "auto":
        check_impl(choice)
        if not installed(choice):
            raise UserError(
                f"the chunked loss {choice!r} needs "
                + (f"`pip install {PACKAGES[choice]}`" if choice in PACKAGES else torch_op_needed())
            )
        return choice
    return next(name for name in IMPLEMENTATIONS if available(name, device_type))


def why_unavailable(choice: str, device_type: str) -> str | None:
    """None if the chunked loss can run on `device_type`, else why not (a stage records it as skipped)."""
    try:
        name = resolve(choice, device_type)
    except UserError as e:
        return str(e)
    if not available(name, device_type):
        return f"the chunked loss {name!r} runs on CUDA only (Triton kernels)"
    return None


def check_impl(name: str) -> None:
    """A UserError unless `name` is one of IMPLEMENTATIONS ("auto" is resolved before it gets here)."""
    if name not in IMPLEMENTATIONS:
        raise UserError(
            f"unknown chunked-loss implementation {name!r}; choose auto or one of {', '.join(IMPLEMENTATIONS)}"
        )


def chunked_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    padding_bias: torch.Tensor | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """Mean cross-entropy of `x @ weight.T` (+ `padding_bias`) against `targets`, without the full logits.

    `padding_bias` is -inf on the rows past `vocab_size`. Computed by implementation `impl` (resolved if "auto");
    autocast does not reach into these ops, so they get the autocast dtype's inputs explicitly."""
    device_type = x.device.type
    impl = resolve(impl, device_type) if impl == "auto" else impl
    dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else x.dtype
    x, weight = x.to(dtype), weight.to(dtype)
    bias = None if padding_bias is None else padding_bias.to(dtype)
    if impl == "torch":
        return F.linear_cross_entropy(x, weight, targets, linear_bias=bias, options=loss_chunking(device_type))
    if impl == "plain":  # eager under torch.compile, as PyTorch's op is: unrolled, its chunks would be one big graph
        return torch.compiler.disable(ChunkedLinearCrossEntropy.apply)(x, weight, bias, targets, LOSS_CHUNK_ROWS)
    check_impl(impl)
    # marked here, not where it is defined: the marker imports Dynamo, 1.1-1.5 s of `import gpt.stage` on the 2-core
    # EPYC, paid by `--help`, `--dry-run` and the report, which never compile (tests/test_layout.py)
    return torch.compiler.disable(triton_library_loss)(impl, x, weight, targets, vocab_size, bias)


def triton_library_loss(
    impl: str, x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab_size: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """liger's or Cut Cross-Entropy's kernels, run as the library ships them, outside torch.compile.

    A compiled model's graph breaks here: on torch 2.11 Dynamo could not trace liger's autograd function (fake tensors
    fail on its torch.addmm(out_dtype=..., out=...)), and Inductor has nothing to add to a library's own Triton
    kernels."""
    if impl == "liger":
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        return liger_fused_linear_cross_entropy(x, weight, targets, bias=bias, accum_dtype=torch.float32)
    from cut_cross_entropy import linear_cross_entropy

    # no bias argument: the real rows only; filter_eps=None computes every gradient entry (exact)
    return linear_cross_entropy(x, weight[:vocab_size], targets, filter_eps=None, impl="cce")


def _chunks(n: int, chunk: int):
    """The row slices of `n` rows, `chunk` at a time (the last one shorter)."""
    return (slice(start, start + chunk) for start in range(0, n, chunk))


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """The mean cross-entropy of `x @ weight.T + bias` against `targets`, `chunk` rows at a time, in plain PyTorch.

    Forward keeps one float per row, its log-sum-exp; backward computes each chunk's logits again, and from them the
    chunk's gradient of the logits, softmax - one-hot over the rows. So no more than one chunk of logits (and its
    gradient) exists at once, for one more head matmul per step than the full loss. As the full loss does, it rounds
    the logits to the inputs' dtype and takes the softmax in fp32; the weight's and bias's gradients are summed over
    the chunks in fp32."""

    @staticmethod
    def forward(ctx, x, weight, bias, targets, chunk):
        n = x.shape[0]
        total = x.new_zeros((), dtype=torch.float32)
        lse = x.new_empty(n, dtype=torch.float32)
        for rows in _chunks(n, chunk):
            logits = F.linear(x[rows], weight, bias).float()
            lse[rows] = torch.logsumexp(logits, dim=-1)
            total += (lse[rows] - logits.gather(1, targets[rows, None]).squeeze(1)).sum()
        ctx.save_for_backward(x, weight, bias, targets, lse)
        ctx.chunk = chunk
        return total / n

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, targets, lse = ctx.saved_tensors
        n, chunk = x.shape[0], ctx.chunk
        grad_x = torch.empty_like(x)
        grad_w = torch.zeros_like(weight, dtype=torch.float32)
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if ctx.needs_input_grad[2] else None
        scale = grad.float() / n
        for rows in _chunks(n, chunk):
            logits = F.linear(x[rows], weight, bias).float()
            g = torch.exp(logits - lse[rows, None])  # the softmax, less one at each row's target below
            g[torch.arange(g.shape[0], device=g.device), targets[rows]] -= 1
            g = (g * scale).to(x.dtype)  # as autograd hands the full loss's logits their gradient
            grad_x[rows] = g @ weight
            grad_w += (g.t() @ x[rows]).float()
            if grad_b is not None:
                grad_b += g.float().sum(0)
        return grad_x, grad_w.to(weight.dtype), None if grad_b is None else grad_b.to(bias.dtype), None, None


def loss_chunking(device_type: str):
    """How F.linear_cross_entropy chunks and accumulates, as a torch.nn.LinearCrossEntropyOptions.

    CUDA: the library's own per-device defaults (bf16/fp16: "compact"); CPU: fixed chunks of LOSS_CHUNK_ROWS rows,
    accumulated in the input's dtype (the measurements: docs/design.md#the-figures-behind-the-rules)."""
    if device_type == "cuda":
        return torch.nn.LinearCrossEntropyOptions()
    return torch.nn.LinearCrossEntropyOptions(
        batch_chunk_size=LOSS_CHUNK_ROWS, chunking_method=None, acc_policy="accurate"
    )


def full_cross_entropy(
    x: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    vocab_size: int,
    padding_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """The full loss the chunked one replaces, as gpt/model.py computes it: every logit, then fp32 cross-entropy."""
    return F.cross_entropy(F.linear(x, weight, padding_bias).float(), targets)


def time_head_and_loss(
    loss_fn,
    rows: int,
    dim: int,
    vocab: int,
    padded_vocab: int,
    dtype: torch.dtype,
    device: torch.device,
    warmup: int = 3,
    repeats: int = 20,
) -> dict:
    """Milliseconds of one forward and backward of the output head and `loss_fn(x, weight, targets, vocab, bias)`.

    The median, min and max of `repeats` calls after `warmup` (CUDA: the peak MiB too), on real tensors, with the random
    state put back as it was (a stage measures this while it builds its model)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        g = torch.Generator(device=device).manual_seed(0)
        x = torch.randn(rows, dim, device=device, generator=g).requires_grad_()
        weight = (0.02 * torch.randn(padded_vocab, dim, device=device, generator=g)).requires_grad_()
        bias = torch.zeros(padded_vocab, device=device)
        bias[vocab:] = float("-inf")
        targets = torch.randint(vocab, (rows,), device=device, generator=g)

        def call():
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = loss_fn(x, weight, targets, vocab, bias)
            loss.backward()
            x.grad = weight.grad = None

        for _ in range(warmup):
            call()
        synchronize(device)
        peak = None
        if device.type == "cuda":
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
            call()
            synchronize(device)
            peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            synchronize(device)
            times.append(1e3 * (time.perf_counter() - t0))
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times), "peak_mib": peak}


def loss_used(cfg: TrainConfig, device_type: str, vocab_size: int) -> tuple[str, str | None]:
    """The loss a stage computes, and why it is not the one its config asks for (None when it is).

    A run for time with loss_impl "auto" computes the full loss, the same mathematics, where the chunked one was
    measured slower (under CUDA graphs: chunked, by rule). A run for memory, or one that names its implementation,
    keeps the chunked loss: its point is the logits it never holds, or the library asked for."""
    if not _falls_back(cfg):
        return cfg.loss, None
    if narrow_vocabulary_rule(cfg, vocab_size):
        padded, dim = padded_vocabulary(cfg, vocab_size), cfg.model_shape["n_embd"]
        return "full", (
            f"kept the full loss by rule: {padded} logits a row are no more than the model's width ({dim}), so the "
            "logits are no larger than the head's input and chunking them saves nothing"
        )
    if cuda_graphs_rule(cfg, torch.device(device_type), "the chunked loss"):
        return "chunked", None
    return measured_loss_choice(cfg, vocab_size, device_type)


def loss_how(cfg: TrainConfig, device_type: str, vocab_size: int) -> str | None:
    """How the loss was chosen among those that run here (the record's choices.loss_how).

    "measured", a rule (narrow_vocabulary_rule; under CUDA graphs gpt/optimizations/compilation.py:cuda_graphs_rule),
    or None where the config's loss runs unchosen."""
    if not _falls_back(cfg):
        return None
    return (
        narrow_vocabulary_rule(cfg, vocab_size)
        or cuda_graphs_rule(cfg, torch.device(device_type), "the chunked loss")
        or "measured"
    )


def narrow_vocabulary_rule(cfg: TrainConfig, vocab_size: int) -> str | None:
    """The rule that keeps the full loss where the (padded) vocabulary is no wider than the model, else None.

    The chunked loss exists so that the (rows x vocabulary) logits are never held at once. Where a row of them is no
    wider than a row of the head's input, which the step holds anyway, there is nothing to save, and chunking only
    adds calls: every committed measurement at the character vocabulary found it slower
    (docs/design.md#the-figures-behind-the-rules). The rule spares a run that measurement."""
    padded, dim = padded_vocabulary(cfg, vocab_size), cfg.model_shape["n_embd"]
    if padded > dim:
        return None
    return f"rule: the full loss where the logits are no wider than the model ({padded} <= {dim})"


def padded_vocabulary(cfg: TrainConfig, vocab_size: int) -> int:
    """The rows of the output head: `vocab_size` padded to a multiple of cfg.vocab_multiple (gpt/model.py)."""
    return -(-vocab_size // cfg.vocab_multiple) * cfg.vocab_multiple


def _falls_back(cfg: TrainConfig) -> bool:
    return cfg.loss == "chunked" and cfg.goal == "time" and cfg.loss_impl == "auto"


def measured_loss_choice(cfg: TrainConfig, vocab_size: int, device_type: str) -> tuple[str, str | None]:
    """The chunked loss where it was measured faster than the full loss on this device; else the full loss.

    The measurement is of the head and loss, forward and backward, at the stage's micro-batch rows, width, (padded)
    vocabulary and precision, compiled when the stage compiles. Measured once per machine (gpt/machine_cache.py)."""
    impl = resolve(cfg.loss_impl, device_type)
    device = torch.device(device_type)
    rows, dim = cfg.micro_batch_size * cfg.block_size, cfg.model_shape["n_embd"]
    padded = padded_vocabulary(cfg, vocab_size)
    dtype = mixed_precision(cfg, device).dtype
    compiled = compile_mode(cfg, device) is not None
    what = (
        f"head and loss, forward and backward, {rows} rows x {dim} -> {vocab_size} classes"
        + (f" (padded to {padded})" if padded != vocab_size else "")
        + f", {str(dtype).removeprefix('torch.')}"
        + (", compiled" if compiled else "")
    )

    def measure():
        # As a compiled model runs them: Inductor fuses the full loss; the chunked op stays eager (the profiled
        # fast_6 step shows it outside the compiled regions; liger and cce run outside compile by design).
        full = torch.compile(full_cross_entropy) if compiled else full_cross_entropy
        chunked = lambda *a: chunked_cross_entropy(*a, impl=impl)  # noqa: E731
        return [
            time_head_and_loss(fn, rows, dim, vocab_size, padded, dtype, device)["median_ms"] for fn in (full, chunked)
        ]

    here = device_label(device)
    full_ms, chunked_ms = machine_cache.remembered(LOSS_CACHE, f"{impl}|{here}|{what}", measure)
    if chunked_ms <= full_ms:
        return "chunked", None
    return "full", (
        f"kept the full loss: the chunked loss ({impl}) is slower on this {here} at this shape ({what}: "
        f"full {full_ms:.2f} ms, chunked {chunked_ms:.2f} ms)"
    )


def implementation_of(model_config) -> str | None:
    """The implementation a model computes its loss with (the record's choices.loss_impl), None for the full loss."""
    return model_config.loss_impl if model_config.loss == "chunked" else None


# ---- fast_6 and lean_2 -------------------------------------------------------------------------------------


def _check(cfg: TrainConfig) -> None:
    if cfg.loss not in LOSSES:
        raise UserError(f"unknown loss {cfg.loss!r} (choose full or chunked)")
    if cfg.loss_impl != "auto":
        check_impl(cfg.loss_impl)


def _cannot_run(cfg: TrainConfig, device_type: str) -> str | None:
    if cfg.loss != "chunked" or _falls_back(cfg):  # a run for time computes the full loss instead (loss_used)
        return None
    return why_unavailable(cfg.loss_impl, device_type)


def _model_settings(cfg: TrainConfig, device_type: str, vocab_size: int) -> dict:
    loss = loss_used(cfg, device_type, vocab_size)[0]
    return {"loss": loss, "loss_impl": resolve(cfg.loss_impl, device_type) if loss == "chunked" else cfg.loss_impl}


def _no_effect(cfg: TrainConfig, device: torch.device) -> str | None:
    if not _falls_back(cfg):
        return None
    from gpt.data import load_prepared  # the vocabulary: the stage's own data set, which it has just read

    return loss_used(cfg, device.type, load_prepared(cfg.data_dir).vocab_size)[1]


def _simulated_with_torch(plan: SimulationPlan) -> None:
    """Have the memory planner simulate the chunked loss with PyTorch's own op (on an older torch, "plain"'s chunks).

    Triton kernels cannot run on fake tensors (liger also keeps the head's fp32 weight gradient from forward to
    backward, which PyTorch's does not). A CPU estimate computes the loss the stage's run chose."""
    if plan.cfg.loss != "chunked":
        return
    if plan.target == "cpu" and loss_used(plan.source, "cpu", plan.vocab_size)[0] == "full":
        plan.cfg.loss = "full"
        return
    plan.cfg.loss_impl = "torch" if installed("torch") else "plain"


CHUNKED_LOSS = Optimization(
    name="chunked linear + cross-entropy",
    fields=("loss", "loss_impl"),
    code="gpt/optimizations/chunked_loss.py:chunked_cross_entropy (called by gpt/model.py:GPT.forward)",
    time_targets=("forward", "backward"),
    memory_targets=("activations", "temporaries"),
    checks=_check,
    cannot_run=_cannot_run,
    model=_model_settings,
    no_effect=_no_effect,
    simulate=_simulated_with_torch,
)

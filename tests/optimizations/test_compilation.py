"""torch.compile (gpt/optimizations/compilation.py, speed_4) trains as eager does, to float32 reassociation.

On the CPU, through the project's own code (tests/equivalence.py). And the rule that compiles only where it pays
(speedrun_12), whose eager run is the mathematics the compiled one is checked against above, and the rule that keeps the
attention and the loss a run asks for under CUDA graphs instead of timing them call by call."""

import dataclasses
import itertools

import pytest
import torch
from equivalence import report, tiny_config, train_with_grads

from gpt import optimizations, train
from gpt.errors import UserError
from gpt.ladder import stage_config, stages_of
from gpt.optimizations.compilation import (
    COMPILE_COSTS,
    compile_mode,
    compile_model,
    compile_skipped,
    serial_scatter_adds,
)

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


# ---- compile only where it pays (speedrun_12) ---------------------------------------------------------------


def test_compiling_only_where_it_pays_keeps_a_short_run_eager_on_every_device_and_compiles_elsewhere():
    """Compiling only where it pays keeps a short run to a loss eager on a CPU and on a GPU, and compiles elsewhere.

    speedrun_12's run to a loss is far shorter than the steps after which a cold compilation pays, on a CPU (54 steps)
    and on a GPU (the reference profile's ~70): eager, with why. The same config compiles with a budget past the
    break-even, and in the timed protocol; its parent, which does not ask, compiles everywhere."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for device, profile, mode in ((cpu, "cpu", "default"), (cuda, "reference", "reduce-overhead")):
        cfg = stage_config("speedrun_12_eager", profile)
        steps, pays = cfg.train_tokens // cfg.tokens_per_step, COMPILE_COSTS[device.type].pays_after_steps
        assert cfg.compile and cfg.compile_if_it_pays and 0 < steps < pays
        assert compile_mode(cfg, device) is None and f"{steps:,} steps" in compile_skipped(cfg, device)
        long = dataclasses.replace(cfg, train_tokens=pays * cfg.tokens_per_step)
        timed = dataclasses.replace(cfg, train_tokens=0)
        assert compile_mode(long, device) == compile_mode(timed, device) == mode
        assert compile_mode(dataclasses.replace(long, train_tokens=long.train_tokens - 1), device) is None
        assert compile_mode(stage_config("speedrun_11_budget", profile), device) == mode
    assert COMPILE_COSTS["cuda"].pays_after_steps == 1956  # 17.8 s / 9.1 ms: the committed GPU records' figures
    with pytest.raises(UserError, match="compile_if_it_pays must be true or false"):
        optimizations.validate(dataclasses.replace(cfg, compile_if_it_pays="yes"))


def test_the_cpu_decision_of_every_speedrun_stage_is_the_one_before_the_rule_covered_gpus():
    """Every speedrun stage decides on the CPU profile as before the rule weighed a GPU's figures too.

    Then: eager exactly where the stage asks to compile only where it pays and trains fewer than 3,000 steps."""
    cpu = torch.device("cpu")
    assert COMPILE_COSTS["cpu"].pays_after_steps == 3000
    for stage in stages_of("speedrun"):
        cfg = stage_config(stage, "cpu")
        eager = cfg.compile_if_it_pays and cfg.train_tokens // cfg.tokens_per_step < 3000
        assert compile_mode(cfg, cpu) == (None if eager else "default"), stage


@pytest.fixture
def restores_deterministic_algorithms():
    """The process-wide switches compile_model sets on a CPU, put back after the test (others share the process)."""
    before = torch.are_deterministic_algorithms_enabled(), torch.utils.deterministic.fill_uninitialized_memory
    threads = torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.utils.deterministic.fill_uninitialized_memory = before[1]
    torch.set_num_threads(threads)


def test_a_stage_that_skips_compiling_trains_an_uncompiled_model_and_records_why(
    char_data, traced_not_compiled, restores_deterministic_algorithms
):
    """A stage that skips compiling trains an uncompiled model and records why.

    What the run does, not only what the rule says: the trainer's model is the GPT itself (no compiled wrapper), and the
    record's choices say why; the parent's model is compiled, its record saying its scatter-adds run serially (None in
    the eager run, and on CUDA)."""
    cpu = torch.device("cpu")
    eager_cfg = stage_config("speedrun_12_eager", "smoke", True, data_dir=str(char_data), device="cpu")
    parent_cfg = stage_config("speedrun_11_budget", "smoke", True, data_dir=str(char_data), device="cpu")
    eager, parent = (train.prepare(c, cpu, 1, "test") for c in (eager_cfg, parent_cfg))
    assert eager.model is eager.gpt and not hasattr(eager.model, "_orig_mod")
    assert eager.choices.record()["compile_mode"] is None and "ran eager" in eager.choices.record()["compile_why"]
    assert hasattr(parent.model, "_orig_mod") and parent.choices.record()["compile_why"] is None
    assert eager.choices.record()["compile_scatter_adds"] is None
    assert parent.choices.record()["compile_scatter_adds"].startswith("serial")
    assert torch.are_deterministic_algorithms_enabled()
    assert serial_scatter_adds("reduce-overhead", "cuda") is None and serial_scatter_adds(None, "cpu") is None


def test_a_compiled_cpu_embedding_adds_its_gradient_in_one_order_every_call(restores_deterministic_algorithms):
    """A compiled CPU model's embedding gradient is the same to the bit in every backward (serial scatter-adds).

    Inductor's own lowering adds the rows of an embedding's gradient with atomic adds across threads: on 2 threads
    each of 12 calls gave a different gradient in the last bits, and two runs of one seed reached the target at
    different steps (docs/speedrun.md, log of 2026-12-05). Compiled through compile_model, all calls must agree."""
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(2)  # the race needs threads; one thread adds in one order anyway
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(80, 128)
    rows = torch.randint(0, 80, (48, 64))  # a speedrun batch: 3,072 rows into 80, most rows hit ~40 times
    upstream = torch.randn(48, 64, 128)
    compiled = compile_model(embedding, "default", "cpu")
    gradients = set()
    for _ in range(12):
        embedding.zero_grad(set_to_none=True)
        compiled(rows).backward(upstream)
        gradients.add(embedding.weight.grad.numpy().tobytes())
    assert len(gradients) == 1, f"{len(gradients)} different gradients in 12 calls"


# ---- the attention and the loss under CUDA graphs ------------------------------------------------------------


def test_under_cuda_graphs_the_attention_and_the_loss_run_by_rule_and_elsewhere_as_measured(char_data, monkeypatch):
    """Under CUDA graphs the attention and the loss a run for time asks for run by rule; elsewhere as measured.

    Each is timed call by call, compiled in the default mode, which is not how a step's CUDA graphs replay it: a
    compiled CUDA run keeps SDPA and the chunked loss untimed, its record saying "rule: ..."; an eager CUDA run and a
    compiled CPU run time both as they run them (here: the explicit attention and the full loss faster) and say
    "measured"."""
    from gpt.model import GPTConfig
    from gpt.optimizations import chunked_loss, fused_attention
    from gpt.run_choices import model_choices

    timed, losses = [], itertools.cycle([{"median_ms": 1.0}, {"median_ms": 5.0}])  # full, then chunked
    monkeypatch.setattr(fused_attention, "time_attentions", lambda *a: timed.append("attention") or [1.0, 4.0])
    monkeypatch.setattr(chunked_loss, "time_head_and_loss", lambda *a, **k: timed.append("loss") or next(losses))
    monkeypatch.setattr(chunked_loss, "why_unavailable", lambda choice, device_type: None)  # a chunked loss everywhere
    monkeypatch.setattr(chunked_loss, "resolve", lambda choice, device_type: "torch")
    for module in (fused_attention, chunked_loss):
        monkeypatch.setattr(module, "device_label", lambda device: "GPU (H200)" if device.type == "cuda" else "CPU")
    model = GPTConfig(vocab_size=65, attention="sdpa", loss="chunked")
    compiled = tiny_config(char_data, attention="sdpa", loss="chunked", compile=True, block_size=18)  # its own shape

    graphs = model_choices(compiled, torch.device("cuda"), model)
    assert graphs["attention_how"].startswith("rule: SDPA as asked under CUDA graphs") and not graphs["attention_why"]
    assert graphs["loss_how"].startswith("rule: the chunked loss as asked under CUDA graphs") and not graphs["loss_why"]
    assert fused_attention.attention_used(compiled, "cuda")[0] == "sdpa"
    assert chunked_loss.loss_used(compiled, "cuda", 65)[0] == "chunked" and timed == []
    eager = dataclasses.replace(compiled, compile=False)
    for cfg, device in ((eager, "cuda"), (compiled, "cpu")):
        got = model_choices(cfg, torch.device(device), model)
        assert got["attention_how"] == got["loss_how"] == "measured"
        assert fused_attention.attention_used(cfg, device)[0] == "naive" and got["attention_why"]
        assert chunked_loss.loss_used(cfg, device, 65)[0] == "full" and got["loss_why"]
    assert timed.count("attention") == 2  # once a device, then kept (gpt/machine_cache.py)

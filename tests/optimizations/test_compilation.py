"""torch.compile (gpt/optimizations/compilation.py, speed_4) trains as eager does, to float32 reassociation.

On the CPU, through the project's own code (tests/equivalence.py). And the rule that compiles only where it pays
(speedrun_12), whose eager run is the mathematics the compiled one is checked against above."""

import dataclasses

import pytest
import torch
from equivalence import report, tiny_config, train_with_grads

from gpt import optimizations, train
from gpt.errors import UserError
from gpt.ladder import stage_config
from gpt.optimizations.compilation import CPU_COMPILE_PAYS_AFTER_STEPS, compile_mode, compile_skipped

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


def test_compiling_only_where_it_pays_keeps_a_short_cpu_run_eager_and_compiles_elsewhere():
    """Compiling only where it pays keeps a short CPU run eager and compiles elsewhere.

    speedrun_12's run to a loss on a CPU is far shorter than the steps after which a cold compilation pays: eager, with
    why. The same config compiles on a GPU, with a budget past the break-even, and in the timed protocol; its parent,
    which does not ask, compiles everywhere."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    cfg = stage_config("speedrun_12_eager", "cpu")
    steps = cfg.train_tokens // cfg.tokens_per_step
    assert cfg.compile and cfg.compile_if_it_pays and 0 < steps < CPU_COMPILE_PAYS_AFTER_STEPS
    assert compile_mode(cfg, cpu) is None and f"{steps:,} steps" in compile_skipped(cfg, cpu)
    assert compile_mode(cfg, cuda) == "reduce-overhead" and compile_skipped(cfg, cuda) is None
    long = dataclasses.replace(cfg, train_tokens=CPU_COMPILE_PAYS_AFTER_STEPS * cfg.tokens_per_step)
    timed = dataclasses.replace(cfg, train_tokens=0)
    assert compile_mode(long, cpu) == compile_mode(timed, cpu) == "default"
    assert compile_mode(stage_config("speedrun_11_budget", "cpu"), cpu) == "default"
    with pytest.raises(UserError, match="compile_if_it_pays must be true or false"):
        optimizations.validate(dataclasses.replace(cfg, compile_if_it_pays="yes"))


def test_a_stage_that_skips_compiling_trains_an_uncompiled_model_and_records_why(char_data):
    """A stage that skips compiling trains an uncompiled model and records why.

    What the run does, not only what the rule says: the trainer's model is the GPT itself (no compiled wrapper), and the
    record's choices say why; the parent's model is compiled."""
    cpu = torch.device("cpu")
    eager_cfg = stage_config("speedrun_12_eager", "smoke", True, data_dir=str(char_data), device="cpu")
    parent_cfg = stage_config("speedrun_11_budget", "smoke", True, data_dir=str(char_data), device="cpu")
    eager, parent = (train.prepare(c, cpu, 1, "test") for c in (eager_cfg, parent_cfg))
    assert eager.model is eager.raw and not hasattr(eager.model, "_orig_mod")
    assert eager.choices.record()["compile_mode"] is None and "ran eager" in eager.choices.record()["compile_why"]
    assert hasattr(parent.model, "_orig_mod") and parent.choices.record()["compile_why"] is None

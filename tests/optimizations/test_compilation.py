"""torch.compile (gpt/optimizations/compilation.py, speed_4) trains as eager does, to float32 reassociation. On the
CPU, through the project's own code (tests/equivalence.py)."""

import pytest
import torch
from equivalence import report, tiny_config, train_with_grads

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

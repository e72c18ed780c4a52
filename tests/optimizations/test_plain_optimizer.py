"""The optimizer stepped outside torch.optim (gpt/optimizations/plain_optimizer.py, speedrun_21): the same steps.

Every parameter to the last bit as MuonWithAdamW (BatchedMuon and fused AdamW) from the same weights and gradients,
through a schedule's changes of rate and momentum; and a stage process that does not compile never imports Dynamo."""

import pytest
import torch
from conftest import needs_muon
from test_first_run import modules_of_a_stage_process
from test_muon import built

from gpt.errors import UserError
from gpt.ladder import stage_config
from gpt.optimizations import owner
from gpt.optimizations.muon import MuonWithAdamW, learning_rates
from gpt.optimizations.plain_optimizer import PLAIN_OPTIMIZER, PlainMuonAdamW
from gpt.optimizations.schedule import set_learning_rates

# The parent's optimizer, as speedrun_20 builds it: batched Muon, fused AdamW, a WSD schedule with Muon's momentum
SPEEDRUN = dict(
    n_layer=2,
    muon_batched=True,
    optimizer_fused=True,
    lr_schedule="wsd",
    lr_cooldown=0.8,
    lr_decay_tokens=10_000,
    muon_lr_warmup=False,
    muon_momentum_warmup_tokens=5_000,
)


@needs_muon
@pytest.mark.parametrize("bf16", [True, False], ids=["bf16", "fp32"])  # a CPU with fast bf16, and one without
def test_steps_equal_muon_with_adamw_bit_for_bit(char_data, bf16, monkeypatch):
    """Four steps of PlainMuonAdamW equal MuonWithAdamW's to the last bit, every parameter and every moment.

    Bit-identical: the same kernels (BatchedMuon's step, torch._fused_adamw_) on the same tensors, so the tolerance is
    zero. Between steps the schedule sets new rates and Muon's momentum on both; a group's setting lost (a decay, a
    beta, the step count's increment that AdamW's bias correction reads) moves them by the second step.
    Seen failing on a fused_adamw_step that passed beta2 for beta1."""
    monkeypatch.setattr("gpt.optimizations.precision.cpu_bf16_is_faster", lambda: (bf16, "as parametrized"))
    plain = check_plain_steps_equal_torchs(char_data, "cpu")
    assert plain.newton_schulz_dtype == (torch.bfloat16 if bf16 else torch.float32)


def check_plain_steps_equal_torchs(char_data, device: str) -> PlainMuonAdamW:
    """PlainMuonAdamW and MuonWithAdamW on `device`, from the same weights and gradients: equal after every step."""
    cfg, reference, torch_optim = built(char_data, device, **SPEEDRUN)
    _, raw, plain = built(char_data, device, plain_optimizer=True, **SPEEDRUN)
    assert isinstance(torch_optim, MuonWithAdamW) and isinstance(plain, PlainMuonAdamW)
    position = {id(p): i for i, p in enumerate(raw.parameters())}  # two models: their parameters compared by place
    twin = {id(p): i for i, p in enumerate(reference.parameters())}
    groups = [[position[id(p)] for p in g["params"]] for g in plain.param_groups]
    assert groups == [[twin[id(p)] for p in g["params"]] for g in torch_optim.param_groups]
    generator = torch.Generator().manual_seed(0)
    for step in range(4):
        tokens = 2_000 * (step + 1)  # through the warm-ups and into the decay (which ends at 10,000: lr 0)
        set_learning_rates(torch_optim, cfg, tokens)
        set_learning_rates(plain, cfg, tokens)
        assert learning_rates(plain) == learning_rates(torch_optim)
        for p, q in zip(reference.parameters(), raw.parameters()):
            p.grad = torch.randn(p.shape, generator=generator).to(p.device)
            q.grad = p.grad.clone()
        before = [p.detach().clone() for p in raw.parameters()]
        torch_optim.step()
        plain.step()
        for (name, p), q, b in zip(reference.named_parameters(), raw.parameters(), before):
            assert torch.equal(p, q), f"step {step}: {name}"
            assert not torch.equal(q, b), f"step {step}: {name} did not move"
        torch_optim.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        assert all(p.grad is None for p in raw.parameters())
    for p, q in zip(reference.parameters(), raw.parameters()):
        theirs = next(s[p] for s in (torch_optim.muon.state, torch_optim.adamw.state) if p in s)  # torch's own
        ours = plain.state[q]
        assert theirs.keys() == ours.keys()
        assert all(torch.equal(theirs[k], ours[k]) for k in theirs), sorted(theirs)
    return plain


def test_a_stage_that_does_not_compile_never_imports_dynamo(char_data, tmp_path):
    """speedrun_21's process, eager (a short run: compiling does not pay), ends without torch._dynamo loaded.

    Its parent's does load it (torch.optim's wrappers import it), so the test sees the one thing the stage changes.
    Seen failing with time_to_loss calling forget_compilations (Dynamo's counters) in an eager run."""
    assert "torch._dynamo" in modules_of_a_stage_process("speedrun_20_untied_head", char_data, tmp_path / "parent")
    assert "torch._dynamo" not in modules_of_a_stage_process("speedrun_21_plain_optimizer", char_data, tmp_path)


def test_the_stage_switches_the_one_flag_and_refuses_what_it_cannot_step():
    cfg = stage_config("speedrun_21_plain_optimizer", "cpu")
    assert cfg.plain_optimizer and owner("plain_optimizer") is PLAIN_OPTIMIZER
    cfg.plain_optimizer = "yes"
    with pytest.raises(UserError, match="plain_optimizer must be true or false, got 'yes'"):
        PLAIN_OPTIMIZER.checks(cfg)
    cfg.plain_optimizer, cfg.optimizer_fused = True, False
    with pytest.raises(UserError, match="plain_optimizer steps batched Muon and fused AdamW"):
        PLAIN_OPTIMIZER.checks(cfg)

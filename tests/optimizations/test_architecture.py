"""Today's small-GPT architecture (gpt/optimizations/architecture.py, code in gpt/model.py), change by change.

Each change does what it says, the two attentions agree on it, the default is GPT-2's model unchanged, and the modern
model learns."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_train import tiny_config

from gpt import model as model_module
from gpt import optimizations, protocol
from gpt.errors import UserError
from gpt.model import GPT, GPTConfig, rotary
from gpt.optimizations.architecture import MODERN

TINY = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=97, block_size=16)


def tiny(**overrides):
    return GPTConfig(**{**TINY, **overrides})


def test_modern_architecture_sets_the_five_fields():
    cfg = tiny_config("unused", architecture="modern")
    assert optimizations.model_settings(cfg, "cpu", 65).items() >= MODERN.items()
    assert MODERN.keys() == set(model_module.ARCHITECTURE_FIELDS)
    assert not MODERN.items() & optimizations.model_settings(tiny_config("unused"), "cpu", 65).items()
    with pytest.raises(UserError, match="unknown architecture 'llama'"):
        optimizations.validate(tiny_config("unused", architecture="llama"))


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("mlp", "swiglu", "unknown mlp 'swiglu'"),
        ("norm", "batchnorm", "unknown norm"),
        ("positions", "alibi", "unknown positions"),
        ("qk_norm", 1, "qk_norm must be true or false"),
        ("zero_init_proj", "yes", "zero_init_proj must be true or false"),
        ("n_embd", 36, "head size 9 .* must be even"),
    ],
)  # 36 / 4 heads = 9 (rotary only)
def test_bad_settings_get_a_user_error(field, value, expected):
    with pytest.raises(UserError, match=expected):
        tiny(**{field: value, "positions": "rotary"} if field == "n_embd" else {field: value})


def test_relu2_is_relu_squared():
    torch.manual_seed(0)
    mlp = GPT(tiny(mlp="relu2")).transformer.h[0].mlp
    x = torch.randn(2, 5, TINY["n_embd"])
    h = mlp.c_fc(x)
    torch.testing.assert_close(mlp.act(h), F.relu(h) ** 2)
    torch.testing.assert_close(mlp(x), mlp.c_proj(F.relu(h) ** 2))


def test_rmsnorm_has_unit_rms_times_its_weight_and_keeps_the_mean():
    torch.manual_seed(0)
    model = GPT(tiny(norm="rmsnorm"))
    for norm in (model.transformer.h[0].ln_1, model.transformer.h[1].ln_2, model.transformer.ln_f):
        assert [n for n, _ in norm.named_parameters()] == ["weight"]  # no bias
        with torch.no_grad():
            norm.weight.uniform_(0.5, 2.0)
        x = 3.0 + torch.randn(4, 7, TINY["n_embd"])  # a large mean: a LayerNorm would remove it
        y = norm(x)
        rms = (y / norm.weight).pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=0)
        torch.testing.assert_close(y, x / x.pow(2).mean(-1, keepdim=True).add(1e-5).sqrt() * norm.weight)
        assert (y / norm.weight).mean(-1).min() > 0.5  # the mean is kept (LayerNorm's would be 0)


def test_zero_init_proj_makes_every_block_the_identity_at_init():
    torch.manual_seed(0)
    model = GPT(tiny(zero_init_proj=True))
    pairs = []
    for block in model.transformer.h:
        block.register_forward_hook(lambda module, args, out: pairs.append((args[0], out)))
    model(torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"])))
    assert len(pairs) == TINY["n_layer"]
    for x, y in pairs:
        assert x.abs().max() > 0
        torch.testing.assert_close(y, x, atol=0, rtol=0)
    # The default starts from GPT-2's small random projections: its blocks change the residual stream.
    pairs.clear()
    torch.manual_seed(0)
    gpt2 = GPT(tiny())
    for block in gpt2.transformer.h:
        block.register_forward_hook(lambda module, args, out: pairs.append((args[0], out)))
    gpt2(torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"])))
    assert all(not torch.equal(x, y) for x, y in pairs)


def test_rotary_scores_depend_only_on_the_distance_and_keep_norms():
    torch.manual_seed(0)
    T, D, shift = 40, 16, 7
    q, k = torch.randn(D, dtype=torch.float64), torch.randn(D, dtype=torch.float64)
    rq = rotary(q.expand(1, T, D))[0]  # the same q at every position 0 .. T-1, rotated by its position
    rk = rotary(k.expand(1, T, D))[0]
    scores = rq @ rk.T  # scores[m, n] = q_m . k_n
    for m, n in [(5, 2), (10, 10), (3, 12), (20, 0)]:
        torch.testing.assert_close(scores[m + shift, n + shift], scores[m, n])  # the same distance m - n
    assert not torch.allclose(scores[5, 2], scores[5, 3])  # another distance: another score
    torch.testing.assert_close(rq.norm(dim=-1), q.norm().expand(T))  # a rotation
    torch.testing.assert_close(rq[0], q)  # position 0: angle 0


def test_rotary_half_splits_the_pairs():
    # Dimension i pairs with i + D/2 (GPT-NeoX, Llama), rotated by t * 10000^(-i / (D/2)).
    D, t = 8, 3
    x = torch.zeros(1, t + 1, D, dtype=torch.float64)
    x[0, t, 1] = 1.0  # the unit vector of dimension 1, at position t
    angle = t * 10000.0 ** (-1 / (D // 2))
    expected = torch.zeros(D, dtype=torch.float64)
    expected[1], expected[1 + D // 2] = np.cos(angle), np.sin(angle)
    torch.testing.assert_close(rotary(x)[0, t], expected)


def test_rotary_model_sees_the_order_of_its_tokens():
    """Rotary positions make a causal attention layer see the order of its prefix, without a position table.

    Without positions one causal attention layer sees its prefix as a bag of tokens: swapping two earlier tokens leaves
    the last position's logits unchanged. Rotary positions make them differ."""
    idx = torch.tensor([[5, 9, 3, 7]])
    swapped = torch.tensor([[9, 5, 3, 7]])
    torch.manual_seed(0)
    model = GPT(tiny(positions="rotary", n_layer=1)).eval()  # one layer: later layers see positions 0, 1 differ
    assert model.transformer.wpe is None and not any("wpe" in n for n, _ in model.named_parameters())
    assert not torch.allclose(model(idx)[0][0, -1], model(swapped)[0][0, -1], atol=1e-5)
    # negative control: the same model with its rotation switched off is blind to the order
    for block in model.transformer.h:
        block.attn.rotary = False
    torch.testing.assert_close(model(idx)[0][0, -1], model(swapped)[0][0, -1])


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_qk_norm_gives_unit_rms_q_and_k_per_head(attention, monkeypatch):
    seen = []
    name = "explicit_attention" if attention == "naive" else "fused_attention"
    original = getattr(model_module, name)
    monkeypatch.setattr(model_module, name, lambda q, k, *rest: seen.append((q, k)) or original(q, k, *rest))
    torch.manual_seed(0)
    model = GPT(tiny(qk_norm=True, attention=attention))
    with torch.no_grad():  # q and k far from unit RMS before the norm
        for block in model.transformer.h:
            block.attn.c_attn.weight.mul_(10.0)
    model(torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"])))
    assert len(seen) == TINY["n_layer"]
    for q, k in seen:  # (B, n_head, T, head_size): the RMS over each head's dimensions, at every position
        assert q.shape == (2, TINY["n_head"], TINY["block_size"], TINY["n_embd"] // TINY["n_head"])
        for t in (q, k):
            rms = t.pow(2).mean(-1).sqrt()
            torch.testing.assert_close(rms, torch.ones_like(rms), atol=1e-4, rtol=0)


def test_naive_and_sdpa_agree_on_the_modern_model():
    torch.manual_seed(0)
    naive = GPT(tiny(attention="naive", **MODERN))
    sdpa = GPT(tiny(attention="sdpa", **MODERN))
    with torch.no_grad():  # away from the zero-initialised projections, so that every parameter matters
        for p in naive.parameters():
            p.add_(0.05 * torch.randn_like(p))
    sdpa.load_state_dict(naive.state_dict())
    idx = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    outputs = []  # the logits and every gradient of each
    for model in (naive, sdpa):
        logits, loss = model(idx, idx.roll(-1, dims=1))
        loss.backward()
        outputs.append({"logits": logits, **{n: p.grad for n, p in model.named_parameters()}})
    assert outputs[0].keys() == outputs[1].keys()
    for name, a in outputs[0].items():
        assert a.abs().max() > 0, name
        torch.testing.assert_close(a, outputs[1][name], atol=1e-5, rtol=1e-4, msg=name)


def test_modern_model_checkpoints_its_blocks_with_the_same_gradients():
    from gpt.optimizations.checkpointing import checkpoint_blocks

    torch.manual_seed(0)
    plain, wrapped = GPT(tiny(**MODERN)), GPT(tiny(**MODERN))
    wrapped.load_state_dict(plain.state_dict())
    checkpoint_blocks(wrapped, tiny_config("unused", activation_checkpointing=True))
    idx = torch.randint(0, TINY["vocab_size"], (2, TINY["block_size"]))
    for model in (plain, wrapped):
        model(idx, idx)[1].backward()
    for (name, a), b in zip(plain.named_parameters(), wrapped.parameters()):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


# GPT-2's model as it was before these fields: its parameters in order, and its loss and logits for seed 0 on a
# fixed batch (printed by the model of commit 2501493). The architecture's defaults must leave them unchanged.
GPT2_PARAMETERS = (
    ["transformer.wte.weight", "transformer.wpe.weight"]
    + [
        f"transformer.h.{i}.{name}"
        for i in range(2)
        for name in (
            "ln_1.weight",
            "ln_1.bias",
            "attn.c_attn.weight",
            "attn.c_attn.bias",
            "attn.c_proj.weight",
            "attn.c_proj.bias",
            "ln_2.weight",
            "ln_2.bias",
            "mlp.c_fc.weight",
            "mlp.c_fc.bias",
            "mlp.c_proj.weight",
            "mlp.c_proj.bias",
        )
    ]
    + ["transformer.ln_f.weight", "transformer.ln_f.bias"]
)


def test_the_default_is_gpt2_unchanged():
    torch.manual_seed(0)
    model = GPT(tiny())
    assert [n for n, _ in model.named_parameters()] == GPT2_PARAMETERS
    assert sum(p.double().sum().item() for p in model.parameters()) == pytest.approx(154.698886739822, rel=1e-9)
    idx = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    logits, loss = model(idx, idx)
    assert loss.item() == pytest.approx(4.179195404052734, abs=1e-5)
    assert logits[0, 3, :4].tolist() == pytest.approx(
        [-0.11554253101348877, -0.06728972494602203, 0.13036328554153442, -0.03186886012554169], abs=1e-5
    )


def test_modern_parameters():
    model = GPT(tiny(**MODERN))
    names = {n for n, _ in model.named_parameters()}
    assert "transformer.wpe.weight" not in names and not any(n.endswith("ln_1.bias") for n in names)
    assert {"transformer.h.0.attn.q_norm.weight", "transformer.h.0.attn.k_norm.weight"} <= names
    # GPT-2's count less the position table and the norms' biases, plus the q/k gains.
    c, head = TINY["n_embd"], TINY["n_embd"] // TINY["n_head"]
    gpt2 = GPT(tiny())
    expected = gpt2.num_params() - TINY["block_size"] * c - (2 * TINY["n_layer"] + 1) * c + 2 * TINY["n_layer"] * head
    assert model.num_params() == expected
    assert model.flops_per_token() == gpt2.flops_per_token() - 6 * (
        gpt2.num_params() - TINY["block_size"] * c - expected
    )


def test_modern_model_builds_on_meta_and_materialises():
    with torch.device("meta"):
        model = GPT(tiny(**MODERN))
    model.to_empty(device="cpu")
    model.init_weights()
    assert torch.all(model.transformer.h[0].attn.q_norm.weight == 1)
    assert torch.all(model.transformer.h[0].mlp.c_proj.weight == 0)
    assert torch.all(model.transformer.ln_f.weight == 1)


def test_hf_loading_is_for_the_gpt2_architecture_only(tmp_path):
    with pytest.raises(UserError, match="positions='rotary'"):
        GPT.from_hf(tmp_path, positions="rotary")
    with pytest.raises(UserError, match="not found"):  # a GPT-2 value passes on to the checkpoint's own checks
        GPT.from_hf(tmp_path / "absent", mlp="gelu")


def test_a_modern_smoke_run_learns(char_data):
    cfg = tiny_config(char_data, architecture="modern", samples=8 * 20, repeats=2, lr=3e-3)  # 1 + 40 steps
    record = protocol.run(cfg, label="test")
    m = record["metrics"]
    assert {k: record["model"][k] for k in MODERN} == MODERN
    assert m["loss_first"] == pytest.approx(np.log(record["model"]["vocab_size"]), abs=0.3)
    assert np.mean(m["losses"][-10:]) < m["loss_first"] - 0.5


# ---- the x0 shortcut (speedrun_9): the embedding mixed into every block's input --------------------------------------


def test_the_x0_shortcut_starts_as_the_model_without_it_and_learns_its_scalars():
    """The x0 shortcut starts as the model without it and learns its scalars.

    Built from the same seed, the model with the shortcut computes the same loss at the start (a = 1, b = 0), has 2 x
    n_layer more parameters, and its scalars get gradients: b_0 and a_0 the same one (block 0's input x is x0)."""
    x = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    torch.manual_seed(0)
    plain = GPT(tiny(**MODERN))
    torch.manual_seed(0)
    with_x0 = GPT(tiny(**MODERN, x0_shortcut=True))
    loss = with_x0(x, x)[1]
    assert torch.equal(loss, plain(x, x)[1])
    assert with_x0.num_params() == plain.num_params() + 2 * TINY["n_layer"]
    assert with_x0.resid_scales.tolist() == [1.0] * TINY["n_layer"] and with_x0.x0_scales.tolist() == [0.0, 0.0]
    loss.backward()
    assert with_x0.x0_scales.grad.abs().min() > 0 and with_x0.resid_scales.grad.abs().min() > 0
    assert torch.equal(with_x0.x0_scales.grad[0], with_x0.resid_scales.grad[0])


def test_the_x0_scales_are_adamws_without_weight_decay_never_muons(char_data):
    from gpt import train
    from gpt.config import TrainConfig

    cfg = optimizations.validate(
        TrainConfig(data_dir=str(char_data), device="cpu", matrix_optimizer="muon", x0_shortcut=True)
    )
    raw, _, optimizer = train.build_model(cfg, 65, torch.device("cpu"))
    scales = {id(raw.resid_scales), id(raw.x0_scales)}
    assert not scales & {id(p) for g in optimizer.muon.param_groups for p in g["params"]}
    no_decay = [g for g in optimizer.adamw.param_groups if g["weight_decay"] == 0.0]
    assert scales <= {id(p) for g in no_decay for p in g["params"]}


@pytest.mark.parametrize("field", ["x0_shortcut", "untied_head"])
def test_the_x0_shortcut_and_the_untied_head_are_refused_on_a_hugging_face_checkpoint(tmp_path, field):
    with pytest.raises(UserError, match=field):
        GPT.from_hf(tmp_path, **{field: True})


# ---- the untied head (speedrun_20): the output head its own matrix -------------------------------------------------


def test_the_untied_head_starts_as_the_tied_matrix_and_every_other_weight_as_the_tied_models():
    """From one seed, the untied head is the tied model's matrix and every block weight is the tied model's.

    Its token embedding is a draw of its own (the one the tied model overwrote); padding rows are zero in both.

    Seen failing with the head left at nn.Linear's default draw (not the tied matrix) and with its padding rows not
    zeroed (they kept that default draw)."""
    config = dict(**MODERN, vocab_multiple=64)  # 97 real rows, 31 of padding
    torch.manual_seed(0)
    tied = GPT(tiny(**config))
    torch.manual_seed(0)
    untied = GPT(tiny(**config, untied_head=True))
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    assert torch.equal(untied.lm_head.weight, tied.lm_head.weight)
    assert not torch.equal(untied.transformer.wte.weight[:97], tied.transformer.wte.weight[:97])
    for name in ("lm_head.weight", "transformer.wte.weight"):
        assert not untied.get_parameter(name)[97:].any()
    blocks = dict(tied.transformer.h.named_parameters())
    assert all(torch.equal(p, blocks[n]) for n, p in untied.transformer.h.named_parameters())
    assert untied.num_params() == tied.num_params() + untied.lm_head.weight.numel()


def test_the_untied_head_learns_apart_from_the_embedding_and_is_adamws_with_weight_decay(char_data):
    """Both matrices get their own gradient; AdamW updates the head with the Linear weights' decay, Muon never."""
    from gpt import train
    from gpt.config import TrainConfig

    cfg = optimizations.validate(
        TrainConfig(data_dir=str(char_data), device="cpu", matrix_optimizer="muon", untied_head=True)
    )
    raw, _, optimizer = train.build_model(cfg, 65, torch.device("cpu"))
    head, wte = raw.lm_head.weight, raw.transformer.wte.weight
    assert head is not wte and raw.config.untied_head
    assert id(head) not in {id(p) for g in optimizer.muon.param_groups for p in g["params"]}
    decay = [g for g in optimizer.adamw.param_groups if g["weight_decay"] == cfg.weight_decay > 0]
    assert id(head) in {id(p) for g in decay for p in g["params"]}
    x = torch.randint(0, 65, (2, 8))
    raw(x, x)[1].backward()
    assert head.grad.abs().sum() > 0 and wte.grad.abs().sum() > 0 and not torch.equal(head.grad, wte.grad)

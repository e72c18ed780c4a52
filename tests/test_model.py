"""Tests for gpt/model.py: init, attention equivalence, parameter counts, HF loading, input errors."""

import json
import math

import pytest
import torch
import torch.nn.functional as F

from gpt.errors import UserError
from gpt.model import GPT, GPTConfig

TINY = dict(n_layer=2, n_head=4, n_embd=32, vocab_size=97, block_size=16)


def tiny(**overrides):
    return GPTConfig(**{**TINY, **overrides})


def test_loss_at_init_is_close_to_uniform():
    # At init the logits are h . wte with h ~ unit variance (after ln_f) and wte ~ N(0, 0.02^2), so
    # logit std is 0.02 * sqrt(n_embd) = 0.16 here. For small random logits the expected loss is
    # ln(V) + var/2 = ln(V) + 0.013, well inside the 0.1 bound; a wrong init (e.g. std 1) breaks it.
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=64, vocab_size=1000, block_size=32))
    idx = torch.randint(0, 1000, (8, 32))
    targets = torch.randint(0, 1000, (8, 32))
    logits, loss = model(idx, targets)
    assert logits.shape == (8, 32, 1000)
    assert loss.dtype == torch.float32 and loss.ndim == 0
    assert abs(loss.item() - math.log(1000)) < 0.1


def test_loss_is_fp32_with_low_precision_logits():
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    model = GPT(tiny())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx, idx)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    # Without autocast nothing upcasts for us: a bf16 model must still report an fp32 loss.
    logits, loss = model.to(torch.bfloat16)(idx, idx)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32


def test_no_targets_no_loss():
    logits, loss = GPT(tiny())(torch.zeros(1, 5, dtype=torch.long))
    assert logits.shape == (1, 5, TINY["vocab_size"]) and loss is None


def test_gpt2_init_and_tied_head():
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, n_head=4, n_embd=128, vocab_size=512, block_size=64))
    assert model.lm_head.weight is model.transformer.wte.weight
    block = model.transformer.h[0]
    assert abs(block.attn.c_attn.weight.std().item() - 0.02) < 0.002
    for w in (block.attn.c_proj.weight, block.mlp.c_proj.weight):
        assert abs(w.std().item() - 0.02 / math.sqrt(2 * 4)) < 0.001
    assert torch.all(block.attn.c_attn.bias == 0) and torch.all(block.mlp.c_fc.bias == 0)
    assert torch.all(block.ln_1.weight == 1) and torch.all(block.ln_1.bias == 0)


def test_causality():
    # Changing a later token must not change earlier logits.
    for attention in ("naive", "sdpa"):
        model = GPT(tiny(attention=attention)).eval()
        idx = torch.randint(0, TINY["vocab_size"], (2, 10))
        changed = idx.clone()
        changed[:, 6] = (changed[:, 6] + 1) % TINY["vocab_size"]
        a, _ = model(idx)
        b, _ = model(changed)
        torch.testing.assert_close(a[:, :6], b[:, :6])
        assert not torch.allclose(a[:, 6:], b[:, 6:])


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_naive_and_sdpa_agree(dropout):
    # Same weights, eval mode: the explicit and the fused attention are the same function.
    torch.manual_seed(0)
    naive = GPT(tiny(attention="naive", dropout=dropout)).eval()
    sdpa = GPT(tiny(attention="sdpa", dropout=dropout)).eval()
    sdpa.load_state_dict(naive.state_dict())
    idx = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    targets = torch.randint(0, TINY["vocab_size"], (3, TINY["block_size"]))
    results = []
    for model in (naive, sdpa):
        logits, loss = model(idx, targets)
        loss.backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters()}))
    (logits_a, grads_a), (logits_b, grads_b) = results
    torch.testing.assert_close(logits_a, logits_b, atol=1e-5, rtol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4, msg=name)


def test_dropout_is_active_only_in_training():
    torch.manual_seed(0)
    model = GPT(tiny(dropout=0.5))
    idx = torch.randint(0, TINY["vocab_size"], (2, 8))
    assert not torch.allclose(model.train()(idx)[0], model.train()(idx)[0])
    torch.testing.assert_close(model.eval()(idx)[0], model.eval()(idx)[0])


def test_block_takes_one_tensor():
    # Activation checkpointing / FSDP wrap each Block from outside and call it with x alone.
    model = GPT(tiny()).eval()
    block = model.transformer.h[0]
    x = torch.randn(2, 8, TINY["n_embd"], requires_grad=True)
    y = block(x)
    assert y.shape == x.shape
    y2 = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
    torch.testing.assert_close(y, y2)


def expected_params(n_layer, n_embd, vocab_size, block_size):
    # Per block: c_attn 3C^2+3C, attn c_proj C^2+C, c_fc 4C^2+4C, mlp c_proj 4C^2+C, two LayerNorms 4C.
    # Plus wte (shared with lm_head), wpe and ln_f.
    c = n_embd
    return n_layer * (12 * c * c + 13 * c) + vocab_size * c + block_size * c + 2 * c


def build_on_meta(name, **overrides):
    # The meta device records shapes only, so even gpt2-xl is built without allocating its weights.
    with torch.device("meta"):
        return GPT(GPTConfig.from_preset(name, **overrides))


@pytest.mark.parametrize(
    "name,count",
    [("gpt2", 124_439_808), ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)],
)
def test_gpt2_parameter_counts(name, count):
    model = build_on_meta(name)
    assert model.num_params() == count  # the published GPT-2 sizes (vocab 50257, block 1024)
    cfg = model.config
    assert count == expected_params(cfg.n_layer, cfg.n_embd, cfg.vocab_size, cfg.block_size)
    embeddings = (cfg.vocab_size + cfg.block_size) * cfg.n_embd
    assert model.num_params(non_embedding=True) == count - embeddings


def test_gpt_mini_and_reference_parameter_counts():
    mini = build_on_meta("gpt-mini")
    assert mini.num_params() == expected_params(6, 192, 50257, 1024) == 12_515_520
    # The reference run: gpt2-large on a character vocabulary (65) with block 128. With the head tied
    # to wte the model has 708,637,440 parameters; the reference's figure of 708,720,640 is exactly
    # 65 * 1280 more, i.e. it counted the lm_head matrix separately (as an untied head would have).
    large = build_on_meta("gpt2-large", vocab_size=65, block_size=128)
    assert large.num_params() == expected_params(36, 1280, 65, 128) == 708_637_440
    assert large.num_params() + 65 * 1280 == 708_720_640


def test_flops_per_token():
    model = build_on_meta("gpt2")
    n = 124_439_808 - 1024 * 768  # all parameters but the position table
    assert model.flops_per_token() == 6 * n + 12 * 12 * 768 * 1024 == 855_166_464


def test_meta_model_can_be_materialised():
    with torch.device("meta"):
        model = GPT(tiny(attention="naive"))
    model.to_empty(device="cpu")
    model.init_weights()
    torch.manual_seed(0)
    reference = GPT(tiny(attention="naive")).eval()
    model.load_state_dict(reference.state_dict())
    idx = torch.randint(0, TINY["vocab_size"], (1, 8))
    torch.testing.assert_close(model.eval()(idx)[0], reference(idx)[0])


# --- Hugging Face checkpoints -------------------------------------------------------------------

HF = dict(n_layer=2, n_head=2, n_embd=16, vocab_size=50, n_positions=12)


def make_hf_state_dict():
    """Random weights in Hugging Face GPT-2's layout, larger than init scale so that every weight matters.

    HF names, Conv1D weights stored [in, out], and the attn.bias / attn.masked_bias buffers."""
    g = torch.Generator().manual_seed(0)
    C, V, P = HF["n_embd"], HF["vocab_size"], HF["n_positions"]

    def rand(*shape, mean=0.0):
        return mean + 0.3 * torch.randn(*shape, generator=g)

    sd = {"wte.weight": rand(V, C), "wpe.weight": rand(P, C), "ln_f.weight": rand(C, mean=1.0), "ln_f.bias": rand(C)}
    for i in range(HF["n_layer"]):
        p = f"h.{i}."
        sd |= {
            p + "ln_1.weight": rand(C, mean=1.0),
            p + "ln_1.bias": rand(C),
            p + "attn.c_attn.weight": rand(C, 3 * C),
            p + "attn.c_attn.bias": rand(3 * C),
            p + "attn.c_proj.weight": rand(C, C),
            p + "attn.c_proj.bias": rand(C),
            p + "ln_2.weight": rand(C, mean=1.0),
            p + "ln_2.bias": rand(C),
            p + "mlp.c_fc.weight": rand(C, 4 * C),
            p + "mlp.c_fc.bias": rand(4 * C),
            p + "mlp.c_proj.weight": rand(4 * C, C),
            p + "mlp.c_proj.bias": rand(C),
            p + "attn.bias": torch.ones(P, P).tril().view(1, 1, P, P),
            p + "attn.masked_bias": torch.tensor(-1e4),
        }
    return sd


def hf_reference_logits(sd, idx):
    """GPT-2 forward written directly over the HF-layout tensors (Conv1D: x @ W + b), in float64."""
    sd = {k: v.double() for k, v in sd.items()}
    C, H = HF["n_embd"], HF["n_head"]
    T = idx.shape[1]

    def ln(x, name):
        return F.layer_norm(x, (C,), sd[name + ".weight"], sd[name + ".bias"], eps=1e-5)

    def conv1d(x, name):
        return x @ sd[name + ".weight"] + sd[name + ".bias"]

    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    for i in range(HF["n_layer"]):
        p = f"h.{i}."
        q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=-1)
        q, k, v = (t.unflatten(-1, (H, C // H)).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(C // H)).masked_fill(future, -math.inf)
        y = (scores.softmax(-1) @ v).transpose(1, 2).flatten(-2)
        x = x + conv1d(y, p + "attn.c_proj")
        h = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))  # HF's "gelu_new"
        x = x + conv1d(h, p + "mlp.c_proj")
    return ln(x, "ln_f") @ sd["wte.weight"].T


def write_hf_dir(directory, fmt):
    sd = make_hf_state_dict()
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({**HF, "n_ctx": HF["n_positions"], "model_type": "gpt2"}))
    if fmt == "safetensors":
        save_file = pytest.importorskip("safetensors.torch", reason="needs safetensors").save_file
        save_file(sd, str(directory / "model.safetensors"))  # hub layout: no prefix, no lm_head
    else:
        # Older pytorch_model.bin layout: "transformer." prefix and an explicit (tied) lm_head.weight.
        bin_sd = {"transformer." + k: v for k, v in sd.items()} | {"lm_head.weight": sd["wte.weight"].clone()}
        torch.save(bin_sd, directory / "pytorch_model.bin")
    return sd


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_from_hf_matches_reference_forward(tmp_path, fmt, attention):
    sd = write_hf_dir(tmp_path / "ckpt", fmt)
    model = GPT.from_hf(tmp_path / "ckpt", attention=attention).eval()
    cfg = model.config
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size) == (2, 2, 16, 50, 12)
    assert model.lm_head.weight is model.transformer.wte.weight
    idx = torch.randint(0, HF["vocab_size"], (2, HF["n_positions"]), generator=torch.Generator().manual_seed(1))
    logits, _ = model(idx)
    torch.testing.assert_close(logits.double(), hf_reference_logits(sd, idx), atol=1e-5, rtol=1e-5)


def test_from_hf_smaller_block_size_crops_positions(tmp_path):
    sd = write_hf_dir(tmp_path / "ckpt", "safetensors")
    model = GPT.from_hf(tmp_path / "ckpt", block_size=8, dropout=0.1).eval()
    assert model.config.block_size == 8 and model.config.dropout == 0.1
    idx = torch.randint(0, HF["vocab_size"], (1, 8))
    torch.testing.assert_close(model(idx)[0].double(), hf_reference_logits(sd, idx), atol=1e-5, rtol=1e-5)
    with pytest.raises(UserError):
        GPT.from_hf(tmp_path / "ckpt", block_size=13)
    with pytest.raises(UserError):
        GPT.from_hf(tmp_path / "ckpt", n_layer=4)


# --- bad input ----------------------------------------------------------------------------------


def test_unknown_preset():
    with pytest.raises(UserError, match="unknown model preset"):
        GPTConfig.from_preset("gpt5")


@pytest.mark.parametrize(
    "overrides",
    [dict(n_embd=100, n_head=3), dict(n_layer=0), dict(attention="flash"), dict(dropout=1.0), dict(no_such_field=1)],
)
def test_invalid_config(overrides):
    with pytest.raises(UserError):
        GPTConfig.from_preset("gpt-mini", **overrides)


def test_n_embd_not_divisible_by_n_head_message():
    with pytest.raises(UserError, match="divisible"):
        GPTConfig.from_preset("gpt2", n_head=7)


def test_sequence_longer_than_block_size():
    model = GPT(tiny())
    with pytest.raises(UserError, match="exceeds block size"):
        model(torch.zeros(1, TINY["block_size"] + 1, dtype=torch.long))


def test_from_hf_missing_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        GPT.from_hf(tmp_path / "nowhere")
    with pytest.raises(UserError, match="config.json"):
        GPT.from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(HF))
    with pytest.raises(UserError, match="pytorch_model.bin"):
        GPT.from_hf(tmp_path)
    # Weights of another shape (here: a missing layer) are reported, not silently half-loaded.
    sd = {k: v for k, v in make_hf_state_dict().items() if not k.startswith("h.1.")}
    save_file = pytest.importorskip("safetensors.torch", reason="needs safetensors").save_file
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(UserError, match="missing"):
        GPT.from_hf(tmp_path)

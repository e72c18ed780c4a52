"""GPT-2 in one file: config, model, and loading of Hugging Face GPT-2 checkpoints.

The architecture is GPT-2's (Radford et al. 2019): learned position embeddings, pre-LayerNorm
blocks, a 4x GELU MLP and an output head that shares its weight with the token embedding.
Module names follow Hugging Face's GPT-2, so a HF checkpoint loads by name (see GPT.from_hf).
Nothing here knows about training: optimizers, checkpointing and wrapping live in other modules.
"""
import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.optimizations.chunked_loss import LOSSES, check_impl, chunked_cross_entropy
from gpt.optimizations.fused_attention import explicit_attention, fused_attention
from gpt.config import PRESETS, check_dropout
from gpt.errors import UserError


ATTENTIONS = ("naive", "sdpa")


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    vocab_size: int = 50257
    block_size: int = 1024  # longest sequence; sets the size of the position embedding table
    dropout: float = 0.0
    bias: bool = True  # biases in Linear and LayerNorm, as GPT-2 has
    attention: str = "sdpa"  # "naive": explicit T x T scores; "sdpa": fused F.scaled_dot_product_attention
    vocab_multiple: int = 1  # pad the embedding/output rows to a multiple of this (64: 50257 -> 50304)
    loss: str = "full"  # "full": logits then cross-entropy; "chunked": fused, never holds all the logits
    loss_impl: str = "auto"  # the chunked loss's implementation (gpt/optimizations/chunked_loss.py)

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def __post_init__(self):
        # Validate here so that every way of building a config (preset, checkpoint, by hand) is checked.
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "vocab_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise UserError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.attention not in ATTENTIONS:
            raise UserError(f"unknown attention {self.attention!r}; choose one of {', '.join(ATTENTIONS)}")
        if self.loss not in LOSSES:
            raise UserError(f"unknown loss {self.loss!r}; choose one of {', '.join(LOSSES)}")
        if self.loss_impl != "auto":
            check_impl(self.loss_impl)
        check_dropout(self.dropout)

    @classmethod
    def from_preset(cls, name, **overrides):
        if name not in PRESETS:
            raise UserError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
        _check_field_names(overrides)
        return cls(**{**PRESETS[name], **overrides})


def _check_field_names(overrides):
    unknown = set(overrides) - {f.name for f in fields(GPTConfig)}
    if unknown:
        raise UserError(f"unknown model config field(s): {', '.join(sorted(unknown))}")


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        # One matmul makes q, k and v for all heads at once (GPT-2's c_attn).
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head = config.n_head
        self.dropout = config.dropout
        self.attention = config.attention
        if self.attention == "naive":
            # Lower-triangular "may attend" mask. Non-persistent: it is derived, not learned, so it stays
            # out of checkpoints; sdpa builds its mask internally and does not pay for this buffer.
            mask = torch.ones(config.block_size, config.block_size, dtype=torch.bool).tril()
            self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_dim): each head attends independently.
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.attention == "naive":
            # Materialises the B x H x T x T score tensor: the memory cost the fused kernel avoids.
            y = explicit_attention(q, k, v, self.mask[:T, :T], self.attn_dropout)
        else:
            y = fused_attention(q, k, v, self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # concatenate the heads again
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU(approximate="tanh")  # GPT-2 was trained with the tanh approximation
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """One transformer layer. forward(x) takes and returns one tensor, so it can be wrapped from
    outside (activation checkpointing, FSDP) without knowing anything else about the model."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        # Pre-LN: normalise the input of each sublayer, keep the residual path an untouched sum.
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        vocab = config.padded_vocab_size
        # The modules' default initialisation is overwritten by init_weights: keep its random draws off the
        # global stream, so that the weights depend on the seed and the real shapes only (not the padding).
        with torch.random.fork_rng(devices=[]):
            self.transformer = nn.ModuleDict(
                dict(
                    wte=nn.Embedding(vocab, config.n_embd),
                    wpe=nn.Embedding(config.block_size, config.n_embd),
                    drop=nn.Dropout(config.dropout),
                    h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                    ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
                )
            )
            self.lm_head = nn.Linear(config.n_embd, vocab, bias=False)
        # Weight tying (as GPT-2): the output head reuses the token embedding, saving vocab x n_embd params.
        self.lm_head.weight = self.transformer.wte.weight
        # Padding rows (vocab_multiple) are never a target: a -inf logit bias gives them probability 0, so the
        # softmax over the real tokens, the loss and every real row's gradient are those of the unpadded model.
        mask = torch.zeros(vocab) if vocab > config.vocab_size else None
        self.register_buffer("vocab_mask", mask, persistent=False)  # filled by init_weights
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 initialisation. Also call it after `to_empty()` on a model built on the meta device:
        it refills the parameters and the naive attention mask."""
        vocab = self.config.vocab_size
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                weight = module.weight
                if weight is self.transformer.wte.weight:  # only the real rows: padding rows start (and stay) 0,
                    weight = weight[:vocab]  # and the random stream, so every weight, is the unpadded model's
                nn.init.normal_(weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                module.reset_parameters()  # weight ones, bias zeros
            elif isinstance(module, CausalSelfAttention) and module.attention == "naive":
                module.mask.copy_(torch.ones_like(module.mask).tril())
        if self.vocab_mask is not None:
            self.transformer.wte.weight[vocab:].zero_()
            self.vocab_mask.zero_()[vocab:] = float("-inf")
        # Each block adds two c_proj outputs to the residual stream; scaling them by 1/sqrt(2 * n_layer)
        # keeps the variance of the residual stream from growing with depth (GPT-2 paper, section 2.3).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise UserError(f"sequence length T={T} exceeds block size {self.config.block_size}")
        pos = torch.arange(T, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None and self.config.loss == "chunked":
            # Fused head + loss in chunks of rows: the (B*T, vocab) logits never exist at once; no logits returned.
            return None, chunked_cross_entropy(x.flatten(0, 1), self.lm_head.weight, targets.reshape(-1),
                                               self.config.vocab_size, self.vocab_mask, self.config.loss_impl)
        # The head as F.linear so the padding rows' -inf bias is added inside the matmul, not in another pass.
        logits = F.linear(x, self.lm_head.weight, self.vocab_mask)
        loss = None
        if targets is not None:
            # Upcast so the softmax and the loss are fp32 even when the logits come out of autocast.
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def num_params(self, non_embedding=False):
        """Unique parameters (the tied wte/lm_head matrix counts once). non_embedding=True leaves out
        both embedding tables, the convention of the scaling-law papers."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if non_embedding:
            n -= self.transformer.wpe.weight.numel() + self.transformer.wte.weight.numel()
        return n

    def flops_per_token(self):
        """Training FLOPs per token, forward plus backward (PaLM paper appendix B; nanoGPT's MFU).

        6 * N: each weight does one multiply-add (2 FLOPs) per token in the forward pass and twice that
        in the backward pass. N leaves out the position table (a lookup, no matmul) but keeps wte,
        which is counted once as the lm_head matmul. 12 * n_layer * n_embd * block_size: the attention
        matmuls q @ k^T and att @ v, 2 * 2 * T * n_embd FLOPs per token and layer in the forward pass,
        times 3 for forward plus backward; counted over the full block, causal mask or not, as PaLM does.
        """
        c = self.config
        padding = (c.padded_vocab_size - c.vocab_size) * c.n_embd  # padded rows are not model work
        n = self.num_params() - self.transformer.wpe.weight.numel() - padding
        return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size

    @classmethod
    def from_hf(cls, path, **overrides):
        """Load a local Hugging Face GPT-2 checkpoint directory (config.json plus model.safetensors or
        pytorch_model.bin). overrides may set dropout, attention, loss, vocab_multiple (padding rows are
        added) or a smaller block_size (the position table is cropped); the architecture itself comes from
        the checkpoint."""
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"Hugging Face checkpoint directory not found: {path}")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise UserError(f"no config.json in {path}: not a Hugging Face checkpoint directory")
        hf_config = json.loads(config_file.read_text())
        names = dict(n_layer="n_layer", n_head="n_head", n_embd="n_embd", vocab_size="vocab_size",
                     block_size="n_positions")  # our name -> Hugging Face GPT-2 config name
        absent = [hf for hf in names.values() if hf not in hf_config]
        if absent:
            raise UserError(f"{config_file} lacks {', '.join(absent)}: not a GPT-2 config")
        arch = {ours: hf_config[hf] for ours, hf in names.items()}

        _check_field_names(overrides)
        fixed = sorted(set(overrides) & (set(arch) | {"bias"}) - {"block_size"})
        if fixed:
            raise UserError(f"cannot override {', '.join(fixed)} when loading {path}: the checkpoint fixes it")
        n_positions = arch["block_size"]
        arch["block_size"] = overrides.pop("block_size", n_positions)
        if arch["block_size"] > n_positions:
            raise UserError(f"block_size {arch['block_size']} exceeds the checkpoint's n_positions {n_positions}")
        model = cls(GPTConfig(**arch, bias=True, **overrides))

        state = _load_hf_state_dict(path)
        ours = {name.removeprefix("transformer."): p for name, p in model.named_parameters()}
        missing, unexpected = sorted(ours.keys() - state.keys()), sorted(state.keys() - ours.keys())
        if missing or unexpected:
            raise UserError(f"{path} does not match GPT-2 {arch}: missing {missing[:3]}, unexpected {unexpected[:3]}")
        # HF GPT-2 uses Conv1D layers, which store weights as [in, out]; nn.Linear wants [out, in].
        conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        with torch.no_grad():
            for name, p in ours.items():
                w = state[name]
                if name.endswith(conv1d):
                    w = w.t()
                if name == "wpe.weight":
                    w = w[: arch["block_size"]]
                if name == "wte.weight" and w.shape[0] < p.shape[0] and w.shape[1] == p.shape[1]:
                    p[: w.shape[0]].copy_(w)  # vocab_multiple: the padding rows keep their (masked) init
                    continue
                if w.shape != p.shape:
                    raise UserError(f"{path}: {name} has shape {tuple(w.shape)}, expected {tuple(p.shape)}")
                p.copy_(w)
        return model


def _load_hf_state_dict(path):
    """The checkpoint's tensors under our names minus the "transformer." prefix, without the tied
    lm_head (it is wte) and without the attention mask buffers (attn.bias, attn.masked_bias)."""
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        raw = load_file(path / "model.safetensors")
    elif (path / "pytorch_model.bin").is_file():
        raw = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise UserError(f"no model.safetensors or pytorch_model.bin in {path}")
    state = {}
    for name, tensor in raw.items():
        name = name.removeprefix("transformer.")
        if name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias")):
            continue
        state[name] = tensor
    return state

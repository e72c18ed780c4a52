"""GPT-2 in one file: config, model, and loading of Hugging Face GPT-2 checkpoints.

The architecture is GPT-2's (Radford et al. 2019), with module names as Hugging Face's, so a checkpoint loads by
name (GPT.from_hf). GPTConfig fields switch to today's small-GPT blocks and add n-gram embeddings (what each is:
docs/speedrun.md#the-models-changes-and-their-sources); their defaults are GPT-2's. Nothing here knows about training.
"""

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gpt.config import PRESETS, check_dropout
from gpt.errors import UserError
from gpt.optimizations.chunked_loss import LOSSES, check_impl, chunked_cross_entropy
from gpt.optimizations.fused_attention import explicit_attention, fused_attention

ATTENTIONS = ("naive", "sdpa")
MLPS = ("gelu", "relu2")
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rotary")
ARCHITECTURE_FIELDS = ("mlp", "norm", "qk_norm", "zero_init_proj", "positions")  # GPT-2's by default


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
    # Today's small-GPT architecture, one change each (gpt/optimizations/architecture.py); defaults: GPT-2's.
    mlp: str = "gelu"  # "relu2": the MLP's activation is relu(x)**2
    norm: str = "layernorm"  # "rmsnorm": divide by the root mean square (no mean subtracted, no bias)
    qk_norm: bool = False  # RMSNorm of each head's q and k before the scores
    zero_init_proj: bool = False  # the attention's and MLP's c_proj start at 0: each block starts as the identity
    positions: str = "learned"  # "rotary": no wpe table; each head's q and k rotated by their position
    bigram_rows: int = 0  # >0: a zero-initialised table of (previous token, token) embeddings added to wte's (bigram)
    trigram_rows: int = 0  # >0: a zero-initialised table of hashed (token-2, token-1, token) embeddings
    fourgram_rows: int = 0  # >0: a zero-initialised table of hashed (token-3, ..., token) embeddings
    x0_shortcut: bool = False  # each block's input a_i * x + b_i * x0 (x0: the embedding), learned, a = 1, b = 0 first
    untied_head: bool = False  # the output head its own matrix, drawn as every Linear is, after every other weight

    @property
    def padded_vocab_size(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def __post_init__(self):
        # Validate here so that every way of building a config (preset, checkpoint, by hand) is checked.
        for name in ("bigram_rows", "trigram_rows", "fourgram_rows"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UserError(f"{name} must be a non-negative integer, got {value!r}")
        for name in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size", "vocab_multiple"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise UserError(f"{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head != 0:
            raise UserError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        for name, choices in (
            ("attention", ATTENTIONS),
            ("loss", LOSSES),
            ("mlp", MLPS),
            ("norm", NORMS),
            ("positions", POSITIONS),
        ):
            if getattr(self, name) not in choices:
                raise UserError(f"unknown {name} {getattr(self, name)!r}; choose one of {', '.join(choices)}")
        for name in ("qk_norm", "zero_init_proj", "x0_shortcut", "untied_head"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.positions == "rotary" and (self.n_embd // self.n_head) % 2:
            raise UserError(
                f"rotary positions rotate pairs of dimensions: the head size "
                f"{self.n_embd // self.n_head} (n_embd / n_head) must be even"
            )
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


def bigram_index(idx, vocab_size: int, rows: int):
    """The bigram table's row of each position of idx (B, T): the row of its (previous token, token) pair.

    Exact where the table has a row for every pair, else hashed into `rows`. Position 0's previous index is vocab_size
    (never a token), so nothing leaks from outside the window."""
    prev = F.pad(idx[:, :-1], (1, 0), value=vocab_size)
    if rows >= (vocab_size + 1) * vocab_size:
        return prev * vocab_size + idx
    return torch.bitwise_xor(prev * 36313, idx * 27191) % rows  # nanochat's and modded-nanogpt's style of hash


# The hash's multiplier for the token k places back (k = 0: the position's own), nanochat's and modded-nanogpt's style
NGRAM_HASH = (27191, 36313, 10007, 7919)


def hashed_ngram_index(idx, vocab_size: int, rows: int, n: int):
    """Each position of idx (B, T)'s row in a table of `rows`: the n tokens ending there, hashed.

    The xor of each token times its place's multiplier (NGRAM_HASH), modulo `rows`; before the window's start, the
    token is vocab_size (never a token), so nothing leaks from outside the window."""
    row = idx * NGRAM_HASH[0]
    for back in range(1, n):
        row = torch.bitwise_xor(row, F.pad(idx[:, :-back], (back, 0), value=vocab_size) * NGRAM_HASH[back])
    return row % rows


def trigram_index(idx, vocab_size: int, rows: int):
    """The trigram table's row of each position of idx (B, T): its (token-2, token-1, token) triple hashed into `rows`.

    Always hashed: an exact table would have (vocab_size + 1)^2 * vocab_size rows."""
    return hashed_ngram_index(idx, vocab_size, rows, 3)


def fourgram_index(idx, vocab_size: int, rows: int):
    """The four-gram table's row of each position of idx (B, T): the four tokens ending there, hashed into `rows`."""
    return hashed_ngram_index(idx, vocab_size, rows, 4)


class RMSNorm(nn.RMSNorm):
    """x / sqrt(mean(x^2) + eps) * weight (Zhang & Sennrich 2019): LayerNorm without the mean and the bias.

    The weight is cast to the input's dtype, so that under autocast the fused kernel runs (it needs the two equal)."""

    def __init__(self, size):
        super().__init__(size, eps=1e-5)  # LayerNorm's eps; nn.RMSNorm's default is the dtype's (bf16: 0.008)

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight.to(x.dtype), self.eps)


def make_norm(config, size):
    return RMSNorm(size) if config.norm == "rmsnorm" else nn.LayerNorm(size, bias=config.bias)


def rotary(x, base: float = 10000.0):
    """Rotary position embedding (RoPE, Su et al. 2021) of x (..., T, head_size), position t = 0 .. T-1.

    Each pair of dimensions is rotated by t * base^(-i / (head_size / 2)), i the pair's index; pairs are half-split
    (dimension i with i + head_size/2, as GPT-NeoX and Llama), not interleaved."""
    T, half = x.size(-2), x.size(-1) // 2
    inv_freq = base ** -(torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angle = torch.arange(T, device=x.device, dtype=torch.float32)[:, None] * inv_freq  # (T, half)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


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
        self.rotary = config.positions == "rotary"
        self.qk_norm = config.qk_norm
        if self.qk_norm:  # over each head's dimensions; a learned gain per dimension, as OLMo 2 and Qwen3
            self.q_norm = RMSNorm(config.n_embd // config.n_head)
            self.k_norm = RMSNorm(config.n_embd // config.n_head)
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
        if self.qk_norm:  # bounded scores: |q . k| / sqrt(head size) <= sqrt(head size) times the gains
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:  # after the norm: a rotation keeps it, and the gains then cannot undo the relative positions
            q, k = rotary(q), rotary(k)
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
        # GPT-2 was trained with the tanh approximation of GELU; ReLU^2 is relu(x)**2 (Primer).
        self.act = nn.GELU(approximate="tanh") if config.mlp == "gelu" else ReLUSquared()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class ReLUSquared(nn.Module):
    def forward(self, x):
        return F.relu(x).square()


class Block(nn.Module):
    """One transformer layer: forward(x) takes and returns one tensor, so it can be wrapped (checkpointing, FSDP)."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config, config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config, config.n_embd)
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
                    bigram=nn.Embedding(config.bigram_rows, config.n_embd) if config.bigram_rows else None,
                    trigram=nn.Embedding(config.trigram_rows, config.n_embd) if config.trigram_rows else None,
                    fourgram=nn.Embedding(config.fourgram_rows, config.n_embd) if config.fourgram_rows else None,
                    wpe=nn.Embedding(config.block_size, config.n_embd) if config.positions == "learned" else None,
                    drop=nn.Dropout(config.dropout),
                    h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                    ln_f=make_norm(config, config.n_embd),
                )
            )
            self.lm_head = nn.Linear(config.n_embd, vocab, bias=False)
        if config.x0_shortcut:  # modded-nanogpt's x0 lambdas: a shortcut from the embedding to every block's input
            self.resid_scales = nn.Parameter(torch.ones(config.n_layer))
            self.x0_scales = nn.Parameter(torch.zeros(config.n_layer))
        # Weight tying (as GPT-2): the output head reuses the token embedding, saving vocab x n_embd params.
        # untied_head (speedrun_20): the head keeps its own matrix; reading a token and predicting one stop sharing it.
        if not config.untied_head:
            self.lm_head.weight = self.transformer.wte.weight
        # Padding rows (vocab_multiple) are never a target: a -inf logit bias gives them probability 0, so the
        # softmax over the real tokens, the loss and every real row's gradient are those of the unpadded model.
        mask = torch.zeros(vocab) if vocab > config.vocab_size else None
        self.register_buffer("vocab_mask", mask, persistent=False)  # filled by init_weights
        self.init_weights()

    @torch.no_grad()
    def init_weights(self):
        """GPT-2 initialisation (also after `to_empty()` from the meta device: it refills the naive mask)."""
        vocab = self.config.vocab_size
        for module in self.modules():
            if any(module is table for table in self.ngram_tables()):  # zero below, and off the random stream:
                continue  # the other weights are drawn as in the model without the tables
            if isinstance(module, (nn.Linear, nn.Embedding)):
                weight = module.weight
                if weight is self.transformer.wte.weight or weight is self.lm_head.weight:  # only the real rows:
                    weight = weight[:vocab]  # padding rows start (and stay) 0, every weight is the unpadded model's
                nn.init.normal_(weight, mean=0.0, std=0.02)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.reset_parameters()  # weight ones, bias zeros
            elif isinstance(module, CausalSelfAttention) and module.attention == "naive":
                module.mask.copy_(torch.ones_like(module.mask).tril())
        for table in self.ngram_tables():  # zero: the model starts as the one without them
            table.weight.zero_()
        if self.config.x0_shortcut:  # the model starts as the one without the shortcut
            self.resid_scales.fill_(1.0)
            self.x0_scales.zero_()
        if self.vocab_mask is not None:
            self.transformer.wte.weight[vocab:].zero_()
            self.lm_head.weight[vocab:].zero_()  # the same rows where the head is tied
            self.vocab_mask.zero_()[vocab:] = float("-inf")
        # Each block adds two c_proj outputs to the residual stream; scaling them by 1/sqrt(2 * n_layer)
        # keeps the variance of the residual stream from growing with depth (GPT-2 paper, section 2.3).
        # zero_init_proj: they start at 0 instead, so every block starts as the identity (modded-nanogpt).
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight") and self.config.zero_init_proj:
                nn.init.zeros_(p)
            elif name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.config.n_layer))

    def forward(self, idx, targets=None):
        B, T = idx.shape
        if T > self.config.block_size:
            raise UserError(f"sequence length T={T} exceeds block size {self.config.block_size}")
        x = self.transformer.wte(idx)
        if self.transformer.bigram is not None:
            x = x + self.transformer.bigram(bigram_index(idx, self.config.vocab_size, self.config.bigram_rows))
        if self.transformer.trigram is not None:
            x = x + self.transformer.trigram(trigram_index(idx, self.config.vocab_size, self.config.trigram_rows))
        if self.transformer.fourgram is not None:
            x = x + self.transformer.fourgram(fourgram_index(idx, self.config.vocab_size, self.config.fourgram_rows))
        if self.transformer.wpe is not None:  # rotary positions: the attention rotates q and k instead
            x = x + self.transformer.wpe(torch.arange(T, device=idx.device))
        x = x0 = self.transformer.drop(x)
        for i, block in enumerate(self.transformer.h):
            if self.config.x0_shortcut:
                x = self.resid_scales[i] * x + self.x0_scales[i] * x0
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None and self.config.loss == "chunked":
            # Fused head + loss in chunks of rows: the (B*T, vocab) logits never exist at once; no logits returned.
            return None, chunked_cross_entropy(
                x.flatten(0, 1),
                self.lm_head.weight,
                targets.reshape(-1),
                self.config.vocab_size,
                self.vocab_mask,
                self.config.loss_impl,
            )
        # The head as F.linear so the padding rows' -inf bias is added inside the matmul, not in another pass.
        logits = F.linear(x, self.lm_head.weight, self.vocab_mask)
        loss = None
        if targets is not None:
            # Upcast so the softmax and the loss are fp32 even when the logits come out of autocast.
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def num_params(self, non_embedding=False):
        """Unique parameters (the tied wte/lm_head once); non_embedding: without the embedding tables."""
        n = sum(p.numel() for p in self.parameters())  # parameters() yields a shared tensor once
        if non_embedding:
            n -= self._lookup_params() + self.transformer.wte.weight.numel()
        return n

    def _lookup_params(self):
        """The tables only looked up, never multiplied: the position and the n-gram embeddings."""
        tables = (self.transformer.wpe, *self.ngram_tables())
        return sum(t.weight.numel() for t in tables if t is not None)

    def ngram_tables(self) -> list[nn.Embedding]:
        """The n-gram embedding tables the model has (bigram, trigram, four-gram): zero at the start."""
        tables = (self.transformer.bigram, self.transformer.trigram, self.transformer.fourgram)
        return [t for t in tables if t is not None]

    def flops_per_token(self):
        """Training FLOPs per token, forward and backward: 6 N + 12 n_layer n_embd T (docs/measurement.md, MFU)."""
        c = self.config
        padding = (c.padded_vocab_size - c.vocab_size) * c.n_embd  # padded rows are not model work
        n = self.num_params() - self._lookup_params() - padding
        return 6 * n + 12 * c.n_layer * c.n_embd * c.block_size

    @classmethod
    def from_hf(cls, path, **overrides):
        """Load a local Hugging Face GPT-2 checkpoint (config.json and model.safetensors or pytorch_model.bin).

        overrides may set dropout, attention, loss, vocab_multiple (padding rows added) or a smaller block_size (the
        position table cropped); the architecture comes from the checkpoint."""
        _check_field_names(overrides)
        not_gpt2 = [
            f"{name}={overrides[name]!r}"
            for name in (
                *ARCHITECTURE_FIELDS,
                "bigram_rows",
                "trigram_rows",
                "fourgram_rows",
                "x0_shortcut",
                "untied_head",
            )
            if overrides.get(name, getattr(GPTConfig, name)) != getattr(GPTConfig, name)
        ]
        if not_gpt2:
            raise UserError(
                f"cannot load a Hugging Face GPT-2 checkpoint with {', '.join(not_gpt2)}: only the GPT-2 "
                "architecture loads one"
            )
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"Hugging Face checkpoint directory not found: {path}")
        config_file = path / "config.json"
        if not config_file.is_file():
            raise UserError(f"no config.json in {path}: not a Hugging Face checkpoint directory")
        hf_config = json.loads(config_file.read_text())
        names = dict(
            n_layer="n_layer", n_head="n_head", n_embd="n_embd", vocab_size="vocab_size", block_size="n_positions"
        )  # our name -> Hugging Face GPT-2 config name
        absent = [hf for hf in names.values() if hf not in hf_config]
        if absent:
            raise UserError(f"{config_file} lacks {', '.join(absent)}: not a GPT-2 config")
        arch = {ours: hf_config[hf] for ours, hf in names.items()}

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
    """The checkpoint's tensors under our names minus the "transformer." prefix.

    The tied lm_head (it is wte) and the attention mask buffers (attn.bias, attn.masked_bias) are left out."""
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

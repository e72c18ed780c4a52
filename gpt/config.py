"""TrainConfig: one object holds every setting of a run; each optimization of every ladder is one field (or two).

Each field belongs to one optimization, declared in its home in gpt/optimizations/ (`optimizations.owner(field)`),
which checks its values. This module knows none of them (they import it); `optimizations.validate(cfg)` checks a
whole config.
"""

import math
from dataclasses import asdict, dataclass, fields

from gpt.command_line import DEVICES
from gpt.errors import UserError

MAX_CONTEXT = 1024  # positions of every GPT-2 model (n_positions); a longer block has no position embedding
# The four GPT-2 sizes, plus a tiny model (minGPT's "gpt-mini") for CPU runs and tests (gpt/model.py builds them).
PRESETS = {
    "gpt-mini": dict(n_layer=6, n_head=6, n_embd=192),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768),  # 124M
    "gpt2-medium": dict(n_layer=24, n_head=16, n_embd=1024),  # 350M
    "gpt2-large": dict(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": dict(n_layer=48, n_head=25, n_embd=1600),  # 1558M
}


@dataclass
class TrainConfig:
    # --- model ---
    preset: str = "gpt-mini"
    n_layer: int | None = None  # overrides of the preset's shape (None: keep the preset's)
    n_head: int | None = None
    n_embd: int | None = None
    block_size: int = 128
    dropout: float = 0.1
    attention: str = "naive"  # "naive" materialises B*H*T*T scores, as the reference model did

    # --- data ---
    data_dir: str = "data/shakespeare_gpt2"
    dataset: str = "raw_text"  # "raw_text": per-sample CPU work; "tokens": pre-tokenised windows

    # --- measurement protocol (the reference's: warm up, then R repeats of "train on N samples") ---
    samples: int = 10240  # N, global: under DDP/FSDP each of the W ranks trains on N/W
    repeats: int = 5
    warmup_iters: int = 10
    seed: int = 3407
    measure_memory: bool = True  # one instrumented step: gpt/protocol.py:memory_step says which
    profile_steps: int = 2  # steps profiled after timing: time breakdown + trace (gpt/step_profiler.py); 0 = off

    # --- training to a loss (gpt/time_to_loss.py): from scratch to a token budget, evaluated on held-out text ---
    train_tokens: int = 0  # the budget; 0: the timed protocol above instead
    eval_every_tokens: int = 0  # evaluate every this many training tokens (and before the first step and at the end)
    eval_windows: int = 200  # held-out windows of the val split, the same for every stage and run (gpt/evaluation.py)
    target_loss: float | None = None  # the validation loss whose crossing is timed (run_all: speed_0's, see README)
    stop_at_target: bool = False  # end at the first evaluation at or below target_loss (the speedrun's stages)

    # --- optimizer: AdamW as the reference (two parameter groups) ---
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # learning-rate schedule (nanoGPT's): linear warm-up over lr_warmup_tokens, then cosine decay to min_lr at
    # lr_decay_tokens; lr_decay_tokens 0 keeps lr constant (the timed protocol's setting). In tokens, not steps, so
    # that stages with different batches follow one schedule.
    lr_warmup_tokens: int = 0
    lr_decay_tokens: int = 0
    min_lr: float = 0.0

    # --- the optimizations: one field per ladder step ---
    batch_size: int = 32  # samples per optimizer step and rank (micro_batch * grad_accum_steps)
    num_workers: int = 0  # DataLoader worker processes
    pin_memory: bool = False  # pinned host batches + non_blocking host-to-device copies
    compile: bool = False  # torch.compile the model
    amp: bool = False  # autocast: fp16 + GradScaler on CUDA, bf16 on CPU
    grad_accum_steps: int = 1  # split each batch into this many micro-batches
    activation_checkpointing: bool = False  # recompute each block's activations in backward
    optimizer_foreach: bool = True  # AdamW multi-tensor path; False = per-parameter for-loop
    distributed: str | None = None  # None | "ddp" | "fsdp"
    nproc: int = 2  # processes for a distributed stage

    # --- beyond the book: the "fast" and "lean" ladders ---
    batch_gather: bool = False  # tokens dataset: each batch one indexing op on the device, no DataLoader
    amp_bf16: bool = False  # with amp: bf16 autocast without a GradScaler on CUDA too
    tf32: bool = False  # CUDA: fp32 matmuls on TF32 tensor cores
    vocab_multiple: int = 1  # pad the vocabulary to a multiple of this (64: 50257 -> 50304)
    optimizer_fused: bool = False  # AdamW fused=True: one kernel updates every parameter
    loss: str = "full"  # "chunked": fused linear + cross-entropy in chunks of rows (no full logits)
    loss_impl: str = "auto"  # who computes the chunked loss (gpt/optimizations/chunked_loss.py); auto: the first there
    fsdp_mixed_precision: bool = False  # FSDP: bf16 parameters for compute, fp32 gradient reduction
    fsdp_cpu_offload: bool = False  # FSDP: parameters, gradients and optimizer state in host memory

    # --- the speedrun ladder: training changes, each judged by the time to the baseline's model ---
    matrix_optimizer: str = "adamw"  # who updates the blocks' 2-D matrices: "muon" (AdamW keeps every other parameter)
    muon_lr: float = 0.02  # Muon's peak learning rate (the schedule scales it as it scales lr)
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0  # set explicitly: torch.optim.Muon's default (0.1) is not AdamW's groups'
    lr_schedule: str = "cosine"  # "wsd": warm-up, stable, then a linear decay over the budget's last lr_cooldown
    lr_cooldown: float = 0.0  # wsd: the share of the schedule (lr_decay_tokens) spent decaying to min_lr
    architecture: str = "gpt2"  # "modern": today's small-GPT blocks (gpt/optimizations/architecture.py)
    bigram_embedding: bool = False  # a learned table per (previous token, token) pair added to the token embedding
    trigram_embedding: bool = False  # a learned table of hashed (token-2, token-1, token) triples, beside the bigram's
    fourgram_embedding: bool = False  # a learned table of hashed (token-3, ..., token) four-grams, beside the trigram's
    x0_shortcut: bool = False  # each block's input a learned mix of the residual stream and the embedding (x0)
    untied_head: bool = False  # the output head its own matrix, not the token embedding's (GPT-2 ties them)
    muon_lr_warmup: bool = True  # False: Muon's groups start at their peak rate (no warm-up; AdamW's keeps its own)
    muon_momentum_warmup_tokens: int = 0  # >0: Muon's momentum rises linearly from 0.85 to muon_momentum over these
    keep_host_memory: bool = False  # CPU: glibc keeps freed blocks for reuse (no page faults for each new tensor)
    compile_if_it_pays: bool = False  # compile only where it pays within the run: a short CPU run to a loss stays eager
    muon_batched: bool = False  # Muon's Newton-Schulz iterations once per shape on the stacked matrices (same result)
    gc_freeze: bool = False  # gc.freeze() before and after set-up: no collection scans the objects it made again
    plain_optimizer: bool = False  # Muon and fused AdamW stepped outside torch.optim: an eager run never imports Dynamo
    eval_near_target_only: bool = False  # no evaluation while the last step's training loss is far above the target

    # --- where it runs, and what for ---
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    # What the run optimizes: "time" (the speed and fast ladders: a kernel measured slower on this device at this
    # shape is not used, e.g. SDPA on some CPUs) or "memory" (the memory and lean ladders: a memory saving is kept)
    goal: str = "time"

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps

    def check_run_settings(self) -> None:
        """A UserError for the run's first bad setting (optimizations.validate then runs each optimization's checks)."""
        if self.batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {self.batch_size}")
        if not 1 <= self.block_size <= MAX_CONTEXT:
            raise UserError(
                f"block size {self.block_size} must be between 1 and the model's context of {MAX_CONTEXT} positions"
            )
        if self.samples < 1 or self.repeats < 1 or self.warmup_iters < 0 or self.profile_steps < 0:
            raise UserError("samples and repeats must be >= 1, warmup_iters and profile_steps >= 0")
        world = self.world_size
        if self.samples % (self.batch_size * world):
            raise UserError(
                f"samples ({self.samples}) must be a multiple of batch size x processes "
                f"({self.batch_size} x {world}) so every repeat trains on exactly N samples"
            )
        if self.device not in DEVICES:
            raise UserError(f"unknown device {self.device!r} (choose auto, cpu or cuda)")
        if self.goal not in ("time", "memory"):
            raise UserError(f"unknown goal {self.goal!r} (choose time or memory)")
        check_dropout(self.dropout)
        self._check_training_to_a_loss()

    def _check_training_to_a_loss(self) -> None:
        if self.train_tokens < 0:
            raise UserError(f"the token budget must be positive, got {self.train_tokens}")
        if self.train_tokens and self.train_tokens < self.tokens_per_step:
            raise UserError(
                f"a budget of {self.train_tokens} tokens is less than one step "
                f"({self.tokens_per_step} tokens: batch x block x processes)"
            )
        if self.train_tokens and self.eval_every_tokens < 1:
            raise UserError(f"the evaluation interval must be at least 1 token, got {self.eval_every_tokens}")
        if self.eval_windows < self.world_size:
            raise UserError(
                f"eval_windows ({self.eval_windows}) must be at least the number of processes "
                f"({self.world_size}): each evaluates its share"
            )
        if self.target_loss is not None and not math.isfinite(self.target_loss):
            raise UserError(f"the target loss must be a finite number, got {self.target_loss}")
        if self.target_loss is not None and self.target_loss <= 0:  # a run to it would train its whole budget
            raise UserError(
                f"the target loss must be above 0 (a cross-entropy never reaches 0), got {self.target_loss}"
            )
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"the learning rate must be a positive number, got {self.lr}")
        if min(self.lr_warmup_tokens, self.lr_decay_tokens) < 0 or not 0 <= self.min_lr <= self.lr:
            raise UserError("the schedule needs lr_warmup_tokens, lr_decay_tokens >= 0 and 0 <= min_lr <= lr")
        if self.lr_decay_tokens and self.lr_decay_tokens <= self.lr_warmup_tokens:
            raise UserError(
                f"lr_decay_tokens ({self.lr_decay_tokens}) must exceed lr_warmup_tokens "
                f"({self.lr_warmup_tokens}): the cosine decay follows the warm-up"
            )

    @property
    def model_shape(self) -> dict:
        """n_layer, n_head and n_embd of the model: the preset's, with this config's overrides."""
        if self.preset not in PRESETS:
            raise UserError(f"unknown model preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        return {
            **PRESETS[self.preset],
            **{k: getattr(self, k) for k in PRESETS[self.preset] if getattr(self, k) is not None},
        }

    @property
    def tokens_per_step(self) -> int:
        """Tokens one optimizer step trains on, all processes together."""
        return self.batch_size * self.block_size * self.world_size

    @property
    def world_size(self) -> int:
        return self.nproc if self.distributed else 1

    @property
    def steps_per_repeat(self) -> int:
        return self.samples // (self.batch_size * self.world_size)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in fields(cls)}
        cfg = cls(**{k: v for k, v in d.items() if k in names})
        cfg.betas = tuple(cfg.betas)
        return cfg


def check_dropout(p: float) -> None:
    """Both configs' rule (TrainConfig checks it before a stage starts, GPTConfig wherever a model is built)."""
    if not 0.0 <= p < 1.0:
        raise UserError(f"dropout must be in [0, 1), got {p!r}")

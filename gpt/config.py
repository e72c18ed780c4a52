"""TrainConfig: one object holds every setting of a run; each optimization of every ladder is one field (or two).

A stage script changes exactly one group of these fields. Each field belongs to one optimization, declared with
everything the project knows about it in its home module in gpt/optimizations/ (`optimizations.owner(field)`),
which also checks its values.
"""
from dataclasses import asdict, dataclass, fields

from gpt import optimizations
from gpt.errors import UserError

MAX_CONTEXT = 1024  # positions of every GPT-2 model (n_positions); a longer block has no position embedding


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

    # --- optimizer: AdamW as the reference (two parameter groups) ---
    lr: float = 5e-4
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.1
    grad_clip: float = 1.0

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

    # --- where it runs ---
    device: str = "auto"  # "auto" | "cpu" | "cuda"

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.grad_accum_steps

    def validate(self) -> "TrainConfig":
        if self.batch_size < 1:
            raise UserError(f"batch size must be >= 1, got {self.batch_size}")
        if not 1 <= self.block_size <= MAX_CONTEXT:
            raise UserError(f"block size {self.block_size} must be between 1 and the model's context of "
                            f"{MAX_CONTEXT} positions")
        if self.samples < 1 or self.repeats < 1 or self.warmup_iters < 0 or self.profile_steps < 0:
            raise UserError("samples and repeats must be >= 1, warmup_iters and profile_steps >= 0")
        world = self.world_size
        if self.samples % (self.batch_size * world):
            raise UserError(
                f"samples ({self.samples}) must be a multiple of batch size x processes "
                f"({self.batch_size} x {world}) so every repeat trains on exactly N samples"
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"unknown device {self.device!r} (choose auto, cpu or cuda)")
        check_dropout(self.dropout)
        optimizations.check(self)  # each optimization checks its own fields
        return self

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

"""Training, as every stage of every ladder does it: the model, one training step, and the `Trainer`.

The loops that drive a Trainer are the measurement protocol's phases (gpt/protocol.py) and training to a loss
(gpt/time_to_loss.py); the memory planner (gpt/memory) runs build_model and train_step on fake tensors.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm import tqdm

from gpt import distributed, optimizations
from gpt.clocks import FeedClock
from gpt.config import TrainConfig
from gpt.data import WindowSampler
from gpt.model import GPT, GPTConfig
from gpt.optimizations.adamw import make_optimizer
from gpt.optimizations.checkpointing import checkpoint_blocks
from gpt.optimizations.collector import freeze_live_objects
from gpt.optimizations.compilation import compile_mode, compile_model
from gpt.optimizations.feeding import make_loader, to_device, training_data
from gpt.optimizations.host_memory import keep_freed_host_memory
from gpt.optimizations.muon import make_muon
from gpt.optimizations.parallel import parallelize
from gpt.optimizations.plain_optimizer import make_plain_muon_adamw
from gpt.optimizations.precision import MixedPrecision, matmul_precision
from gpt.optimizations.schedule import set_learning_rates
from gpt.run_choices import RunChoices
from gpt.run_choices import resolve as resolve_choices
from gpt.step_profiler import step_phase


def build_model(cfg: TrainConfig, vocab_size: int, device: torch.device):
    """The model with the ladder's model-side optimizations applied, in the order they compose.

    Checkpoint the blocks, shard/replicate them, build the optimizer over the final parameters, compile the whole. Every
    rank builds identical weights from the same seed (FSDP does not broadcast them), then reseeds with its rank added,
    so that ranks draw different dropout masks, as one process would for the different samples of one batch."""
    model_cfg = GPTConfig(
        vocab_size=vocab_size,
        block_size=cfg.block_size,
        dropout=cfg.dropout,
        **cfg.model_shape,
        **optimizations.model_settings(cfg, device.type, vocab_size),
    )
    torch.manual_seed(cfg.seed)
    raw = GPT(model_cfg)
    if device.type != "cpu":  # built on the CPU already: skipping the no-op move lets gpt/memory build
        raw = raw.to(device)  # under FakeTensorMode, whose fake parameters refuse Module.to's swap
    model = checkpoint_blocks(raw, cfg)  # memory_2: each block's inside recomputed in backward
    model = parallelize(model, cfg, device)  # speed_6, memory_4: DDP or FSDP2 over the stage's processes
    # AdamW: foreach=False in memory_3, fused in fast_5; in the speedrun from speedrun_3, Muon for the blocks' matrices
    if cfg.plain_optimizer:  # speedrun_21: the same steps outside torch.optim, which imports Dynamo in an eager run
        optimizer = make_plain_muon_adamw(model, cfg)
    else:
        optimizer = make_muon(model, cfg) if cfg.matrix_optimizer == "muon" else make_optimizer(model, cfg)
    model = compile_model(model, compile_mode(cfg, device), device.type)  # speed_4: None (eager) where the rule says so
    torch.manual_seed(cfg.seed + distributed.rank())
    return raw, model, optimizer


def _grad_sync(model, last_micro_batch: bool):
    """The context of a micro-batch's backward: DDP's no_sync, except for the last micro-batch.

    DDP all-reduces gradients in every backward; with accumulation only the last micro-batch needs it. (FSDP
    reduce-scatters every micro-batch: keeping unsharded gradients would cost the memory FSDP saves.)"""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, torch.nn.parallel.DistributedDataParallel) and not last_micro_batch:
        return inner.no_sync()
    return torch.enable_grad()


def train_step(model, optimizer, x, y, cfg: TrainConfig, amp: MixedPrecision) -> torch.Tensor:
    """One optimizer step on a batch of `cfg.batch_size` samples; returns the batch's mean loss (on device).

    Each of the `grad_accum_steps` micro-batches' losses is divided by their number: the same update as one batch."""
    k = cfg.grad_accum_steps
    total = torch.zeros((), device=x.device)
    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k))):
        with _grad_sync(model, last_micro_batch=i == k - 1):
            with step_phase("forward"):
                with amp.autocast():  # speed_5: torch.autocast, where the run computes in 16 bits
                    _, loss = model(xm, ym)
                loss = loss / k
            with step_phase("backward"):
                amp.scaler.scale(loss).backward()  # the scaler, disabled unless fp16, passes each call through
        total += loss.detach()
    with step_phase("optimizer"):
        amp.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        amp.scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
        amp.scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return total


# ----------------------------------------------------------------------------------------------------------
# the trainer: a stage's model, data and precision, and its step on the next batch


@dataclass
class Trainer:
    """A training run: the stage's settings, the model, its optimizer, its batches, and its step on the next one.

    `gpt` is the GPT itself, `model` what trains, with its wrappers; `choices` every per-device decision
    (run_choices.py)."""

    cfg: TrainConfig
    device: torch.device
    rank: int
    gpt: torch.nn.Module
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    batches: Iterator
    choices: RunChoices
    progress: tqdm
    steps_done: int = 0

    @property
    def tokens_seen(self) -> int:
        """Training tokens so far, all processes together."""
        return self.steps_done * self.cfg.tokens_per_step

    @property
    def cuda_graphs(self) -> bool:
        """Whether the step replays CUDA graphs (the run's choices)."""
        return self.choices.cuda_graphs

    def step(self, feed: FeedClock | None = None) -> torch.Tensor:
        """One training step on the next batch; its loss, on the device (`feed`, if given, times the batch's wait)."""
        feed = feed or FeedClock(self.device)
        with feed.data():
            batch = next(self.batches)
        with feed.copy():
            x, y = to_device(batch, self.device, self.cfg)  # speed_3: non_blocking from pinned memory
        if self.cfg.lr_decay_tokens:  # a schedule (training to a loss); the timed protocol keeps lr constant
            set_learning_rates(self.optimizer, self.cfg, self.tokens_seen + self.cfg.tokens_per_step)
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be reused
        loss = train_step(self.model, self.optimizer, x, y, self.cfg, self.choices.amp)
        self.steps_done += 1
        self.progress.update()
        return loss.clone() if self.cuda_graphs else loss

    def run(self, steps: int, feed: FeedClock | None = None, mark=None) -> list[torch.Tensor]:
        """The training loop, as every run trains: `steps` steps; their losses, on the device (no `.item()`, no sync).

        `mark()`, if given, is called before each step and after the last (a per-step clock)."""
        losses = []
        for _ in range(steps):
            if mark:
                mark()
            losses.append(self.step(feed))
        if mark:
            mark()
        return losses


def prepare(cfg: TrainConfig, device: torch.device, steps: int, label: str) -> Trainer:
    """Data, model, optimizer, precision, and a sampler that draws exactly the `steps` batches the run will take."""
    rank = distributed.rank()
    freeze_live_objects(cfg)  # speedrun_19: the imports' objects, out of the collector's reach
    # before the run's first tensors: every block freed from here is kept
    host_allocator = keep_freed_host_memory(cfg, device)
    dataset = training_data(cfg)
    raw, model, optimizer = build_model(cfg, dataset.vocab_size, device)
    fp32_matmuls = matmul_precision(cfg, device)  # fast_2: TF32
    choices = resolve_choices(cfg, device, fp32_matmuls, host_allocator, raw.config)  # the precision among them
    sampler = WindowSampler(len(dataset), cfg.batch_size, steps, cfg.seed, rank, cfg.world_size)
    batches = iter(make_loader(dataset, sampler, cfg, device))  # speed_1, speed_2, speed_3: a DataLoader
    progress = tqdm(total=steps, desc=label, unit="step", disable=rank != 0, dynamic_ncols=True)
    freeze_live_objects(cfg)  # speedrun_19: and the set-up's, torch._dynamo's modules among them
    return Trainer(cfg, device, rank, raw, model, optimizer, batches, choices, progress)

"""One training step for every stage of every ladder: the model with the stage's optimizations, and the step
(micro-batches, backward, clipping, the optimizer). gpt/protocol.py measures it; gpt/memory simulates it.
"""
import torch

from gpt import chunked_loss, distributed
from gpt.config import TrainConfig
from gpt.model import GPT, GPTConfig
from gpt.optimizations import checkpoint_blocks, compile_model, make_optimizer, parallelize
from gpt.profiling import region


def build_model(cfg: TrainConfig, vocab_size: int, device: torch.device):
    """The model with the ladder's model-side optimizations applied, in the order they compose:
    checkpoint the blocks, then shard/replicate them, then build the optimizer over the final (possibly
    sharded) parameters, then compile the whole.

    Every rank builds identical weights from the same seed (FSDP does not broadcast them); then each rank
    reseeds with its rank added, so that ranks draw different dropout masks, as one process would for the
    different samples of one batch. Rank 0 (or the one process) draws the masks of seed + 0."""
    torch.manual_seed(cfg.seed)
    overrides = {k: getattr(cfg, k) for k in ("n_layer", "n_head", "n_embd") if getattr(cfg, k) is not None}
    loss_impl = chunked_loss.resolve(cfg.loss_impl, device.type) if cfg.loss == "chunked" else cfg.loss_impl
    model_cfg = GPTConfig.from_preset(cfg.preset, vocab_size=vocab_size, block_size=cfg.block_size,
                                      dropout=cfg.dropout, attention=cfg.attention, loss=cfg.loss,
                                      loss_impl=loss_impl, vocab_multiple=cfg.vocab_multiple, **overrides)
    raw = GPT(model_cfg)
    if device.type != "cpu":  # built on the CPU already: skipping the no-op move lets gpt/memory build
        raw = raw.to(device)  # under FakeTensorMode, whose fake parameters refuse Module.to's swap
    model = checkpoint_blocks(raw, cfg)
    model = parallelize(model, cfg, device)
    optimizer = make_optimizer(model, cfg)
    model = compile_model(model, cfg, device)
    torch.manual_seed(cfg.seed + distributed.rank())
    return raw, model, optimizer


def _grad_sync(model, last_micro_batch: bool):
    """DDP all-reduces gradients in every backward; with accumulation only the last micro-batch needs it.
    (FSDP reduce-scatters every micro-batch: keeping unsharded gradients would cost the memory FSDP saves.)"""
    inner = getattr(model, "_orig_mod", model)
    if isinstance(inner, torch.nn.parallel.DistributedDataParallel) and not last_micro_batch:
        return inner.no_sync()
    return torch.enable_grad()


def train_step(model, optimizer, x, y, cfg: TrainConfig, amp) -> torch.Tensor:
    """One optimizer step on a batch of `cfg.batch_size` samples; returns the batch's mean loss (on device).

    Gradient accumulation: the batch is split into `grad_accum_steps` micro-batches; each micro-batch
    loss is divided by their number, so the summed gradients are the gradient of the mean loss over the
    whole batch: the same update, with the activations of one micro-batch alive at a time."""
    k = cfg.grad_accum_steps
    total = torch.zeros((), device=x.device)
    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k))):
        with _grad_sync(model, last_micro_batch=i == k - 1):
            with region("forward"):
                with amp.autocast():
                    _, loss = model(xm, ym)
                loss = loss / k
            with region("backward"):
                (amp.scaler.scale(loss) if amp.scaler else loss).backward()
        total += loss.detach()
    with region("optimizer"):
        if amp.scaler:
            amp.scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        if amp.scaler:
            amp.scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
            amp.scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return total

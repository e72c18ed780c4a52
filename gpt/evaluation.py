"""The validation loss a stage is judged by when it trains to a loss (gpt/time_to_loss.py).

A fixed set of held-out windows: `eval_windows` windows of block_size + 1 tokens of the prepared `val` split, their
starts drawn by a generator of their own seeded with EVAL_SEED, so every stage, every seed and every run of a
profile is evaluated on the same text, and drawing them touches no random state of training. The loss is the full
cross-entropy in fp32 from the model's logits, whatever loss the stage trains with (a chunked bf16 loss is off by
up to ~1%, README), computed in `model.eval()` under `torch.no_grad()` with the stage's autocast, on the training
device. Under DDP/FSDP every rank evaluates its share (the same number of batches on each, as FSDP's collectives
need) and the sums are all-reduced.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpt.data import TokenWindowDataset, load_prepared
from gpt.errors import UserError

EVAL_SEED = 20261125  # the windows' own seed: the same windows whatever the training seed


class ValidationSet:
    """The held-out windows of a run: `count` windows of the val split, the same for every run of its shape."""

    def __init__(self, data_dir, block_size: int, count: int):
        prepared = load_prepared(data_dir)  # one line if the val split is missing
        self.windows = TokenWindowDataset(prepared.bin_path("val"), block_size, prepared.vocab_size)
        if count > len(self.windows):
            raise UserError(
                f"{count} evaluation windows of {block_size + 1} tokens need a longer val split than "
                f"{prepared.bin_path('val')} ({len(self.windows) + block_size} tokens)"
            )
        generator = torch.Generator().manual_seed(EVAL_SEED)
        self.starts = torch.randint(len(self.windows), (count,), generator=generator)

    def share(self, rank: int, world: int) -> torch.Tensor:
        """This rank's windows: an equal share for every rank (the set is cut to a multiple of the ranks)."""
        per_rank = len(self.starts) // world
        return self.starts[rank * per_rank : (rank + 1) * per_rank]

    def batch(self, starts: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = zip(*(self.windows[int(i)] for i in starts))
        return torch.stack(x).to(device), torch.stack(y).to(device)


@torch.no_grad()
def validation_loss(
    raw: torch.nn.Module, val: ValidationSet, batch_size: int, amp, device: torch.device, rank: int = 0, world: int = 1
) -> float:
    """Mean cross-entropy per token over the validation windows. `raw` is the GPT itself (not its compiled or DDP
    wrapper: evaluation must not recompile or record graphs); its train/eval mode is restored."""
    was_training = raw.training
    raw.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.float64, device=device)
    try:
        for starts in val.share(rank, world).split(batch_size):
            x, y = val.batch(starts, device)
            with amp.autocast():
                logits, _ = raw(x)
            total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").double()
            tokens += y.numel()
    finally:
        raw.train(was_training)
    if world > 1:
        both = torch.stack([total, tokens])
        dist.all_reduce(both)
        total, tokens = both
    return (total / tokens).item()

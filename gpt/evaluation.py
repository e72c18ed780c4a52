"""The validation loss a stage is judged by when it trains to a loss (gpt/time_to_loss.py).

A fixed set of held-out windows (their own seed, EVAL_SEED), the full fp32 cross-entropy whatever loss the stage
trains with, in `model.eval()` under `torch.no_grad()` with the stage's autocast; under DDP/FSDP every rank evaluates
an equal share and the sums are all-reduced. A run that stops at its target reads an estimate on a quarter of the
windows while it is clearly above it (`TowardTarget`). How, and why the target is still declared where reading every
window would: docs/time-to-loss.md. The same loop (`train_and_evaluate`) serves the noise scale (gpt/noise_scale.py).
"""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gpt.data import TokenWindowDataset, load_prepared
from gpt.errors import UserError

EVAL_SEED = 20261125  # the windows' own seed: the same windows whatever the training seed
ESTIMATE_SHARE = 4  # an estimate reads the first quarter of each process's windows (rounded to whole batches)
MIN_ESTIMATE_WINDOWS = 30  # fewer windows give no trustworthy standard error: every evaluation is then full
MARGIN_SE = 4.0  # "near the target": within this many standard errors of the estimate (plus the last fall)


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


@dataclass
class WindowSums:
    """Sums over some evaluated windows (all processes together), and their changes against a reference.

    Cross-entropy, targets, count, the sum of squared window means, and against a reference (the same windows at an
    earlier evaluation) the sums of each window's change and its square; `losses`: this process's, a later reference."""

    loss: float
    tokens: float
    windows: int
    square: float
    change: float = 0.0
    change_square: float = 0.0
    losses: torch.Tensor | None = None

    def __add__(self, other: "WindowSums") -> "WindowSums":
        return WindowSums(
            self.loss + other.loss, self.tokens + other.tokens, self.windows + other.windows, self.square + other.square
        )

    @property
    def mean(self) -> float:
        return self.loss / self.tokens

    def moved(self, offset: float) -> "WindowSums":
        """These sums with their mean loss moved by `offset` (an estimate's prediction of the full windows' loss)."""
        return replace(self, loss=self.loss + offset * self.tokens)

    def standard_error(self, population: int) -> float:
        """The standard error of these windows' mean loss as an estimate of the mean over the `population` windows.

        The windows are part of them, drawn without replacement (the finite-population factor); the error is read from
        their own spread."""
        return _standard_error(self.square, self.mean, self.windows, population)

    def change_standard_error(self, population: int) -> float:
        """The same for these windows' mean change since their reference, from the spread of their changes."""
        return _standard_error(self.change_square, self.change / self.windows, self.windows, population)


def _standard_error(square: float, mean: float, n: int, population: int) -> float:
    variance = max(0.0, (square - n * mean**2) / (n - 1))
    return math.sqrt(variance / n * (1 - n / population))


@torch.no_grad()
def window_sums(
    raw: torch.nn.Module,
    val: ValidationSet,
    batch_size: int,
    amp,
    device: torch.device,
    rank: int = 0,
    world: int = 1,
    part: slice = slice(None),
    reference: torch.Tensor | None = None,
) -> WindowSums:
    """The sums over `part` of every process's share of the windows, and their changes since `reference`.

    `raw` is the GPT itself (not its compiled or DDP wrapper: evaluation must not recompile or record graphs); its
    train/eval mode is restored."""
    was_training = raw.training
    raw.eval()
    # loss, targets, windows, squared window losses, changes from the reference and their squares: one all-reduce
    sums = torch.zeros(6, dtype=torch.float64, device=device)
    per_window = [torch.zeros(0, dtype=torch.float64, device=device)]
    try:
        for starts in val.share(rank, world)[part].split(batch_size):
            x, y = val.batch(starts, device)
            with amp.autocast():
                logits, _ = raw(x)
            # one cross-entropy per token serves the total and each window's mean (the spread over windows, for
            # an estimate's standard error); summed in float64
            per_token = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none").double()
            sums[0] += per_token.sum()
            sums[1] += y.numel()
            per_window.append(per_token.mean(1))
    finally:
        raw.train(was_training)
    losses = torch.cat(per_window)
    change = losses - reference if reference is not None else torch.zeros_like(losses)
    sums[2:] = torch.stack([losses.new_tensor(len(losses)), losses.square().sum(), change.sum(), change.square().sum()])
    if world > 1:
        dist.all_reduce(sums)
    loss, tokens, windows, square, changed, changed_square = sums.tolist()
    return WindowSums(loss, tokens, round(windows), square, changed, changed_square, losses)


def validation_loss(
    raw: torch.nn.Module, val: ValidationSet, batch_size: int, amp, device: torch.device, rank: int = 0, world: int = 1
) -> float:
    """Mean cross-entropy per token over the validation windows (window_sums': every window)."""
    return window_sums(raw, val, batch_size, amp, device, rank, world).mean


def estimate_windows(per_rank: int, batch_size: int, world: int) -> int | None:
    """How many of each process's `per_rank` windows an estimate reads: ESTIMATE_SHARE-th of them, or None.

    The share is rounded to whole batches (at least one; so the estimate and the rest are the full evaluation's
    batches); None where that is not fewer than all of them or gives fewer than MIN_ESTIMATE_WINDOWS in all."""
    k = max(1, round(per_rank / ESTIMATE_SHARE / batch_size)) * batch_size
    return k if k < per_rank and k * world >= MIN_ESTIMATE_WINDOWS else None


def near_target(
    estimate: WindowSums, population: int, target: float, previous: float | None, offset: float | None = None
) -> bool:
    """Whether an estimate's prediction of the full windows' loss may reach the target by the next evaluation.

    Within MARGIN_SE standard errors of the target plus the fall since the previous evaluation (`previous`). `offset`:
    the full windows' loss less the estimate's windows' at the last full evaluation (None: none yet, the estimate's own
    loss and spread)."""
    fall = max(0.0, previous - estimate.mean) if previous is not None else 0.0
    if offset is None:
        predicted, error = estimate.mean, estimate.standard_error(population)
    else:
        predicted, error = estimate.mean + offset, estimate.change_standard_error(population)
    return predicted - MARGIN_SE * error - fall <= target


class TowardTarget:
    """The evaluations of a run that stops at `target` (None: it does not, every evaluation reads every window).

    Each reads the estimate's windows first, and the rest unless that estimate is clearly above the target or `full` is
    asked; an estimate's loss is its prediction of every window's (never at or below the target: crossing needs it)."""

    def __init__(self, per_rank: int, batch_size: int, world: int, target: float | None):
        self.population, self.target = per_rank * world, target
        self.k = estimate_windows(per_rank, batch_size, world) if target is not None else None
        self.previous: float | None = None  # the previous evaluation's loss on the estimate's windows
        self.reference: torch.Tensor | None = None  # this process's estimate windows' losses at the last full one
        self.offset: float | None = None  # the full windows' loss less the estimate's windows' there

    def skip(self) -> None:
        """An evaluation not taken (speedrun_22's screen): the next one has no previous loss to measure a fall from."""
        self.previous = None

    def __call__(self, sums: Callable[[slice, torch.Tensor | None], WindowSums], full: bool = False) -> WindowSums:
        """This evaluation: the estimate's windows, or every window (the class docstring).

        `sums(part, reference)` reads `part` of each process's windows, and their changes since `reference`."""
        if self.k is None:
            return sums(slice(None), None)
        estimate = sums(slice(0, self.k), self.reference)
        near = full or near_target(estimate, self.population, self.target, self.previous, self.offset)
        self.previous = estimate.mean
        if not near:  # its loss: the prediction of the full windows', above the target by the margin at least
            return estimate.moved(self.offset or 0.0)
        whole = estimate + sums(slice(self.k, None), None)
        self.reference, self.offset = estimate.losses, whole.mean - estimate.mean
        return whole


def train_and_evaluate(
    steps: int, interval: int, steps_done: Callable[[], int], train: Callable[[int], None], evaluate: Callable[[], bool]
) -> None:
    """The loop of a run evaluated every `interval` optimizer steps, before the first and after the last (`steps`).

    `train(n)` runs the n steps to the next evaluation (it may run fewer; the loop then asks again); the loop ends after
    the last step's evaluation, or at the first evaluation that returns True."""
    while True:
        done = steps_done()
        if (done % interval == 0 or done == steps) and evaluate():
            return
        if done == steps:
            return
        train(min(interval - done % interval, steps - done))

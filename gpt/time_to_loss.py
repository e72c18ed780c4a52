"""Training to a loss: a stage trained from scratch to a token budget, its validation loss curve, its time to a target.

The run trains with the timed protocol's own step and loop (gpt/train.py: Trainer.run); what it adds is the
evaluation (gpt/evaluation.py), outside the training clock, and the curve (its keys: docs/records.md#the-json-record).
The clock is synchronised at every evaluation only: no `.item()` and no synchronisation between two of them.
"""

import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from gpt import distributed, train
from gpt.clocks import beyond_steady, minor_page_faults, process_age_s
from gpt.config import TrainConfig
from gpt.devices import resolve_device, synchronize
from gpt.errors import UserError
from gpt.evaluation import TowardTarget, ValidationSet, WindowSums, train_and_evaluate, validation_loss, window_sums
from gpt.loss_curve import crossing
from gpt.optimizations import evaluation_screen, parallel
from gpt.optimizations.compilation import startup_steps as startup_steps_of
from gpt.optimizations.muon import learning_rates
from gpt.protocol import compile_cache_state, forget_compilations, run_facts


def run(cfg: TrainConfig, label: str = "train") -> dict:
    """Train `cfg` (validated where it was built) to its token budget and return the run's record (rank 0's)."""
    if not cfg.train_tokens:
        raise UserError("training to a loss needs a token budget (train_tokens, --train-tokens)")
    device = resolve_device(cfg.device)
    with distributed.process_group(device, parallel.backend(cfg, device)):
        return train_to_budget(cfg, device, label)


class TrainingClock:
    """Seconds of training only: it runs between two synchronisations and stops for every evaluation."""

    def __init__(self, device: torch.device):
        self.device, self.seconds = device, 0.0

    def measure(self, work) -> float:
        """Run `work()` on the clock; return its seconds (the device synchronised at both ends)."""
        synchronize(self.device)
        t0 = time.perf_counter()
        work()
        synchronize(self.device)
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        return seconds


def train_to_budget(cfg: TrainConfig, device: torch.device, label: str) -> dict:
    """The run (this module's docstring), in one process."""
    steps = cfg.train_tokens // cfg.tokens_per_step
    import_setup_s, t0 = process_age_s(), time.perf_counter()
    trainer = train.prepare(cfg, device, steps, label)
    val = ValidationSet(cfg.data_dir, cfg.block_size, cfg.eval_windows)
    setup_s = time.perf_counter() - t0
    world, clock = cfg.world_size, TrainingClock(device)
    interval = max(1, round(cfg.eval_every_tokens / cfg.tokens_per_step))  # steps between two evaluations
    losses: list[torch.Tensor] = []
    curve, eval_s, startup_steps, cache, skipped = [], 0.0, [], None, 0
    faults = [0, 0]  # minor page faults during the steady training steps, and those steps
    startup_count = startup_steps_of(trainer.cuda_graphs)  # compiling; under CUDA graphs their recording
    evaluation = evaluation_of(trainer, val, cfg)

    def evaluate() -> bool:
        nonlocal eval_s, skipped
        t0 = time.perf_counter()
        # the curve's ends read every window
        sums = evaluation(trainer.steps_done in (0, steps), lambda: _mean_across_ranks(losses[-1:], device, world))
        eval_s += time.perf_counter() - t0
        if sums is None:  # skipped (speedrun_22): the next point's training loss is of every step since the last
            skipped += 1
            return False
        rates = learning_rates(trainer.optimizer)
        curve.append(
            {
                "step": trainer.steps_done,
                "tokens": trainer.tokens_seen,
                "seconds": clock.seconds,
                "wall_s": process_age_s(),  # the process's wall clock at this evaluation: W&B's other x-axis
                "train_loss": _mean_across_ranks(losses, device, world),
                "val_loss": sums.mean,
                "windows": sums.windows,
                "estimate": sums.windows < len(val.share(0, world)) * world,
                **(rates if trainer.steps_done else dict.fromkeys(rates)),
            }
        )  # no rate before a step
        losses.clear()
        return at_target(cfg, curve)

    def run_steps(todo: int) -> None:
        nonlocal cache
        done = trainer.steps_done
        if done >= startup_count:
            before = minor_page_faults()
            clock.measure(lambda: losses.extend(trainer.run(todo)))
            if before is not None:
                faults[0] += minor_page_faults() - before
                faults[1] += todo
            return
        compiling = done == 0 and trainer.choices.compile_mode  # Dynamo's counters: an eager run does not import it
        if compiling:
            forget_compilations()
        startup_steps.append(clock.measure(lambda: losses.extend(trainer.run(1))))  # on its own: compilation
        if compiling:
            cache = compile_cache_state()

    # the untrained model is evaluated first: where every curve starts
    train_and_evaluate(steps, interval, lambda: trainer.steps_done, run_steps, evaluate)
    trainer.progress.close()
    metrics = budget_metrics(cfg, curve, clock.seconds, startup_steps, eval_s, trainer.steps_done, cache)
    return {
        **run_facts(trainer, label),
        "metrics": {
            **metrics,
            "evaluations_skipped": skipped,
            "minor_faults_per_step": faults[0] / faults[1] if faults[1] else None,
            "import_setup_s": import_setup_s,
            "setup_s": setup_s,
            "process_s": process_age_s(),
        },
    }


def at_target(cfg: TrainConfig, curve: list[dict]) -> bool:
    """Whether a run that stops at its target has reached it: its last evaluation, on every window, at or below it.

    The crossing is read from the curve up to there, so stopping changes no figure but the final loss."""
    last = curve[-1]
    return (
        cfg.stop_at_target
        and cfg.target_loss is not None
        and not last.get("estimate")
        and last["val_loss"] <= cfg.target_loss
    )


def evaluation_of(
    trainer: train.Trainer, val: ValidationSet, cfg: TrainConfig
) -> Callable[[bool, Callable[[], float | None]], WindowSums | None]:
    """The run's evaluation, `evaluate(full, last_train_loss)` -> the window sums now, or None: skipped.

    An estimate on fewer windows while clearly above the target (TowardTarget); with speedrun_22's screen, nothing
    while the last step's training loss (`last_train_loss()`, asked only then) is far above it."""
    batch, world = trainer.cfg.micro_batch_size, cfg.world_size
    toward = TowardTarget(
        len(val.share(trainer.rank, world)), batch, world, cfg.target_loss if cfg.stop_at_target else None
    )
    screened = evaluation_screen.screens(cfg)

    def sums(part: slice, reference: torch.Tensor | None) -> WindowSums:
        return window_sums(
            trainer.gpt, val, batch, trainer.choices.amp, trainer.device, trainer.rank, world, part, reference
        )

    def evaluate(full: bool, last_train_loss: Callable[[], float | None]) -> WindowSums | None:
        if screened and not full and evaluation_screen.far_above_target(last_train_loss(), cfg.target_loss):
            toward.skip()  # speedrun_22: no window read
            return None
        return toward(sums, full)

    return evaluate


def validation_loss_of(trainer: train.Trainer, val: ValidationSet) -> float:
    """The validation loss of the trainer's model now, every process evaluating its share of the windows."""
    return validation_loss(
        trainer.gpt,
        val,
        trainer.cfg.micro_batch_size,
        trainer.choices.amp,
        trainer.device,
        trainer.rank,
        trainer.cfg.world_size,
    )


def _mean_across_ranks(losses: list[torch.Tensor], device: torch.device, world: int) -> float | None:
    """The mean training loss of the steps since the last point, over every rank (None before the first step)."""
    if not losses:
        return None
    mean = torch.stack(losses).float().mean()
    if world > 1:
        dist.all_reduce(mean)
        mean /= world
    return mean.item()


def budget_metrics(
    cfg: TrainConfig,
    curve: list[dict],
    train_s: float,
    startup_steps: list[float],
    eval_s: float,
    steps: int,
    compile_cache: str | None,
) -> dict:
    """The record's metrics: the curve with the start-up taken out of its seconds, the rates, the target.

    Start-up: what each of `startup_steps` took beyond a steady step (the others' mean; with none, their fastest)."""
    n = len(startup_steps)
    steady_s = (train_s - sum(startup_steps)) / (steps - n) if steps > n else min(startup_steps, default=0.0)
    extra = beyond_steady(startup_steps, steady_s)
    startup_s = sum(extra)
    for point in curve:  # the start-up of the steps done by then: a point between two start-up steps has one's only
        point["seconds"] = max(0.0, point["seconds"] - sum(extra[: point["step"]])) if point["step"] else 0.0
    final = curve[-1]
    return {
        "curve": curve,
        "steps": steps,
        "tokens": final["tokens"],
        "train_seconds": train_s - startup_s,
        "startup_s": startup_s,
        "first_step_s": startup_steps[0] if startup_steps else None,
        "compile_cache": compile_cache,
        "eval_seconds": eval_s,
        "evaluations": len(curve),
        "estimates": sum(bool(p.get("estimate")) for p in curve),  # evaluations on fewer windows (evaluation_of)
        "windows_evaluated": sum(p["windows"] for p in curve),
        "tokens_per_s": final["tokens"] / max(train_s - startup_s, 1e-9),
        "val_loss_initial": curve[0]["val_loss"],
        "val_loss_final": final["val_loss"],
        "train_loss_final": final["train_loss"],
        "target_loss": cfg.target_loss,
        "target": crossing(curve, cfg.target_loss) if cfg.target_loss is not None else None,
        "stopped_at_target": at_target(cfg, curve),
    }

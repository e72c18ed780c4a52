"""The gradient noise scale along a training run, and the batch it recommends (McCandlish et al. 2018, appendix A.1).

    python -m gpt.noise_scale --profile cpu --out noise_scale_cpu.json --batches 12,24,48,96,192

The estimator, the window it is read over and the batch it chooses:
docs/speedrun.md#choosing-the-batch-from-a-measurement.
"""

import argparse
import functools
import math
import statistics
import sys
from pathlib import Path

import torch

from gpt import optimizations, train
from gpt.config import TrainConfig
from gpt.data import prepare_if_missing
from gpt.devices import device_name, resolve_device
from gpt.errors import UserError, exit_on_user_error
from gpt.evaluation import ValidationSet, train_and_evaluate
from gpt.ladder import stage_config
from gpt.optimizations import accumulation
from gpt.optimizations.precision import mixed_precision
from gpt.record_reuse import REUSED_FROM, data_sha256, provenance, reuse_record, reused_note, was_reused
from gpt.records import environment, writable_dir, write_record
from gpt.settings_profiles import PROFILES
from gpt.time_to_loss import TrainingClock, validation_loss_of

BASELINE = "speed_0_baseline"
# The part of the record that does not depend on the machine (gpt/record_reuse.py): reused while its code is unchanged
CURVE_KEYS = ("config", "batch_size", "block_size", "estimator", "curve", "window", "provenance", REUSED_FROM)
# t(B) is timed with the code the batch stage runs on: its parent's (speedrun_1's systems changes, batch kept)
TIMED_WITH = "speedrun_1_systems"
EMA_SHARE = 1 / 20  # the moving averages' time constant, as a share of the run's steps (100 of the cpu run's 2000)
READ_FROM = 0.75  # B_noise for the choice: the means over the run's steps from this share of the budget on
BATCH_MULTIPLES = (1, 2, 4, 8)  # the batches t(B) is timed at by default, in multiples of the baseline's
CHOOSES_FOR = "speedrun_2_batch_lr"  # the stage that trains at the chosen batch: its own batch is always timed too


# ---- the estimator ------------------------------------------------------------------------------------------


def step_estimates(small_sq, big_sq, b_small: float, b_big: float):
    """Unbiased estimates of |G|^2 and of S = tr(Sigma) from one draw of |G_small|^2 and |G_big|^2.

    The draws may be floats or tensors of draws; the estimates are the paper's appendix A.1."""
    g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
    s = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return g2, s


def b_simple(g2: list[float], s: list[float]) -> float:
    """S / |G|^2 from the two estimates' means over the same steps: averaged apart, then divided."""
    return statistics.fmean(s) / statistics.fmean(g2)


def ema(values: list[float], steps: float) -> list[float]:
    """The exponential moving average after each value, time constant `steps`, bias-corrected as Adam's moments are."""
    beta, avg, out = 1 - 1 / steps, 0.0, []
    for t, v in enumerate(values, 1):
        avg = beta * avg + (1 - beta) * v
        out.append(avg / (1 - beta**t))
    return out


class HalvesNorms:
    """Gradient hooks that record each step's squared norms in a run whose batch is two halves of `half` micro-batches.

    A hook on every parameter reads its gradient after the first half and after both, before clipping, and adds the
    step's |G_small|^2 and |G_big|^2 into row `step()` of `norms`, on the device; it changes nothing."""

    def __init__(self, params: list[torch.nn.Parameter], half: int, steps: int, step, device: torch.device):
        self.half, self.step = half, step
        self.norms = torch.zeros(steps, 2, dtype=torch.float64, device=device)
        self.calls = [0] * len(params)
        self.first: list[torch.Tensor | None] = [None] * len(params)
        self.handles = [p.register_post_accumulate_grad_hook(self._hook(i)) for i, p in enumerate(params)]

    def _hook(self, i: int):
        def read(p: torch.Tensor):
            self.calls[i] += 1
            if self.calls[i] == self.half:  # the first half's mean gradient (each micro-loss was divided by 2*half)
                self.first[i] = 2 * p.grad.detach().float()
            elif self.calls[i] == 2 * self.half:
                g_a, g = self.first[i], p.grad.detach().float()
                g_b = 2 * g - g_a
                row = self.norms[self.step()]
                row[0] += (g_a.square().sum() + g_b.square().sum()).double() / 2
                row[1] += g.square().sum().double()
                self.calls[i], self.first[i] = 0, None

        return read

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


# ---- the measurement ----------------------------------------------------------------------------------------


def halves_config(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with each batch trained as two halves (twice its micro-batches): the same update up to rounding."""
    if cfg.distributed:
        raise UserError("the noise scale is measured in one process: choose a stage without DDP/FSDP")
    if mixed_precision(cfg, resolve_device(cfg.device)).scaler.is_enabled():
        raise UserError("the noise scale needs unscaled gradients: fp16 with a GradScaler scales them (use bf16)")
    return optimizations.validate(accumulation.split_further(cfg, 2))


def measure(cfg: TrainConfig | None = None, profile: str = "cpu", label: str = "noise scale") -> dict:
    """Train `cfg` (default: speed_0 on the speedrun's task of `profile`) to its budget, its batch as two halves.

    Returns the curve (at every evaluation: tokens, validation loss, the moving averages of |G|^2 and S, B_simple) and
    B_noise, the means over the window from READ_FROM of the budget on."""
    cfg = cfg or stage_config(BASELINE, profile, speedrun_task=True)
    if not cfg.train_tokens:
        raise UserError("measuring the noise scale trains to a token budget: the config has none (train_tokens)")
    measured = halves_config(cfg)
    device = resolve_device(cfg.device)
    steps = cfg.train_tokens // cfg.tokens_per_step
    trainer = train.prepare(measured, device, steps, label)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    norms = HalvesNorms(params, accumulation.micro_batches(cfg), steps, lambda: trainer.steps_done, device)
    val = ValidationSet(cfg.data_dir, cfg.block_size, cfg.eval_windows)
    interval = max(1, round(cfg.eval_every_tokens / cfg.tokens_per_step))
    evaluations = []  # (step, val_loss)

    def evaluate() -> bool:
        evaluations.append((trainer.steps_done, validation_loss_of(trainer, val)))
        return False  # the whole budget, every window: the curve's every point is a full evaluation

    try:
        train_and_evaluate(steps, interval, lambda: trainer.steps_done, trainer.run, evaluate)
    finally:
        norms.remove()
        trainer.progress.close()
    small_sq, big_sq = norms.norms.cpu().T.tolist()  # the run's one read-back of the norms
    return noise_record(cfg, small_sq, big_sq, evaluations)


def noise_record(
    cfg: TrainConfig, small_sq: list[float], big_sq: list[float], evaluations: list[tuple[int, float]]
) -> dict:
    """The curve and the window reading from the per-step squared norms and the evaluations."""
    b = cfg.batch_size
    g2, s = step_estimates(torch.tensor(small_sq), torch.tensor(big_sq), b / 2, b)
    g2, s = g2.tolist(), s.tolist()
    steps = len(g2)
    time_constant = max(1.0, EMA_SHARE * steps)
    g2_avg, s_avg = ema(g2, time_constant), ema(s, time_constant)
    curve = []
    for step, val_loss in evaluations:
        point = {
            "step": step,
            "tokens": step * cfg.tokens_per_step,
            "val_loss": val_loss,
            "grad_sq": None,
            "trace_sigma": None,
            "b_simple": None,
        }
        if step:
            point.update(
                grad_sq=g2_avg[step - 1], trace_sigma=s_avg[step - 1], b_simple=s_avg[step - 1] / g2_avg[step - 1]
            )
        curve.append(point)
    start = min(int(READ_FROM * steps), steps - 1)
    b_noise = b_simple(g2[start:], s[start:])
    return {
        "config": cfg.to_dict(),
        "batch_size": b,
        "block_size": cfg.block_size,
        "estimator": {"b_small": b / 2, "b_big": b, "ema_steps": time_constant, "units": "samples"},
        "curve": curve,
        "window": {
            "from_step": start,
            "to_step": steps,
            "from_tokens": start * cfg.tokens_per_step,
            "grad_sq": statistics.fmean(g2[start:]),
            "trace_sigma": statistics.fmean(s[start:]),
            "b_noise": b_noise,
            "b_noise_tokens": b_noise * cfg.block_size,
            "rule": f"the means of both estimates over the steps from {READ_FROM:.0%} of the budget on, then divided",
        },
    }


def step_times(cfg: TrainConfig, batches, warmup: int = 3, repeats: int = 7, label: str = "t(B)") -> dict[int, float]:
    """Seconds of one training step of `cfg` at each batch size on its device.

    The mean of `repeats` steps after `warmup` untimed ones, timed as training to a loss times them (data feed
    included). A compiled `cfg` compiles afresh at each batch, with static shapes, as the stage at that batch does."""
    device = resolve_device(cfg.device)
    times = {}
    for batch in batches:
        # compiled as the stage's own process compiles it, for this one batch: without the reset, Dynamo would mark
        # the batch dimension dynamic from the second size on, and time every later batch on a dynamic-shape graph
        torch._dynamo.reset()
        at_b = optimizations.validate(
            TrainConfig.from_dict({**cfg.to_dict(), "batch_size": batch, "samples": batch * (warmup + repeats)})
        )
        trainer = train.prepare(at_b, device, warmup + repeats, f"{label} B={batch}")
        trainer.run(warmup)
        # a step synchronised on its own would wait for the device to drain and lose the overlap of its host work
        # with the previous step's kernels, which training keeps
        times[batch] = TrainingClock(device).measure(functools.partial(trainer.run, repeats)) / repeats
        trainer.progress.close()
        del trainer
    return times


# ---- the choice ---------------------------------------------------------------------------------------------


def choose_batch(b_noise: float, times: dict[int, float], baseline: int) -> dict:
    """The batch minimising the predicted time to a loss, (1 + B_noise/B) t(B), and its speedup on the baseline."""
    if baseline not in times:
        raise ValueError(f"the baseline's batch {baseline} has no step time")
    if not b_noise > 0:
        raise UserError(f"the noise scale must be positive to choose a batch, got {b_noise}")
    predicted = {b: (1 + b_noise / b) * t for b, t in times.items()}
    best = min(predicted, key=predicted.get)
    return {
        "batch": best,
        "speedup": predicted[baseline] / predicted[best],
        "tokens_factor": (1 + best / b_noise) / (1 + baseline / b_noise),  # E(B) = E_min (1 + B/B_noise)
        "relative_time": {b: predicted[b] / predicted[baseline] for b in sorted(predicted)},
    }


def suggested_settings(cfg: TrainConfig, batch: int) -> dict:
    """The starting point for a sweep at `batch`: `cfg`'s learning rates and beta2 scaled to that batch.

    The learning rate follows the square-root rule for Adam, and beta2 keeps its half-life unchanged in tokens
    (beta2^(B/B0)); the warm-up is already in tokens."""
    ratio = batch / cfg.batch_size
    return {"lr": cfg.lr * math.sqrt(ratio), "min_lr": cfg.min_lr * math.sqrt(ratio), "beta2": cfg.betas[1] ** ratio}


# ---- the command line ---------------------------------------------------------------------------------------


def parse_batches(text: str) -> list[int]:
    try:
        batches = sorted({int(b) for b in text.split(",")})
    except ValueError:
        raise UserError(f"--batches takes batch sizes separated by commas (e.g. 12,24,48), got {text!r}") from None
    if batches[0] < 1:
        raise UserError(f"--batches must all be at least 1, got {text!r}")
    return batches


def timed_batches(baseline: int, stage: int, text: str | None) -> list[int]:
    """The batches t(B) is timed at: `text`'s (--batches), else BATCH_MULTIPLES of the baseline's.

    The baseline's batch and the batch stage's are always among them, so the choice is weighed against what it runs."""
    chosen = parse_batches(text) if text else [m * baseline for m in BATCH_MULTIPLES]
    return sorted({*chosen, baseline, stage})


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m gpt.noise_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="cpu", help=f"settings profile: {', '.join(PROFILES)} (default: cpu)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--data-dir", help="prepared data directory (default: the profile's)")
    p.add_argument("--out", help="write the record (curve, step times, choice) to this JSON file")
    p.add_argument(
        "--reuse",
        metavar="JSON",
        help="an earlier record of this command: its noise-scale curve is reused "
        "(the step times are measured afresh) if it was measured with the same code, torch, profile and data",
    )
    p.add_argument(
        "--batches",
        help="batch sizes whose step time is measured (default: 1, 2, 4 and 8 times the "
        f"baseline's); the baseline's and {CHOOSES_FOR}'s are always added",
    )
    return p.parse_args(argv)


@exit_on_user_error
def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    data_dir = str(Path(args.data_dir).resolve()) if args.data_dir else None
    cfg = stage_config(BASELINE, args.profile, speedrun_task=True, device=args.device, data_dir=data_dir)
    batches = timed_batches(cfg.batch_size, stage_config(CHOOSES_FOR, args.profile).batch_size, args.batches)
    halves_config(cfg)  # bad settings: one line before anything runs
    timed = stage_config(TIMED_WITH, args.profile, device=args.device, data_dir=data_dir)
    if reason := optimizations.why_cannot_run(timed, resolve_device(timed.device).type):
        raise UserError(f"t(B) is timed with {TIMED_WITH}'s code, which cannot run here: {reason}")
    out = Path(args.out) if args.out else None
    if out:
        writable_dir(out.parent)
    if not args.data_dir:
        prepare_if_missing(cfg.data_dir)
    device = resolve_device(cfg.device)
    key = {"profile": args.profile, "device_type": device.type, "data": data_sha256(cfg.data_dir)}
    reused = reuse_record(args.reuse, key)
    record = (
        {k: reused[k] for k in CURVE_KEYS}
        if reused
        # provenance after the run: its imports are done
        else {**measure(cfg), "provenance": provenance(key, device_name(device))}
    )
    times = step_times(timed, batches)
    choice = choose_batch(record["window"]["b_noise"], times, cfg.batch_size)
    record.update(
        device=device_name(device),
        env=environment(),
        step_times={b: t for b, t in times.items()},
        choice={**choice, "suggested": suggested_settings(cfg, choice["batch"])},
    )
    print_summary(record)
    if out:
        write_record(out, record)
        print(f"record: {out}")
    return 0


def tokens_factor(b_noise: float, batch: int, factor: float) -> float:
    """How many times the tokens a batch `factor` times larger needs to the same loss.

    (1 + kB/B_noise) / (1 + B/B_noise), from the predicted tokens E_min (1 + B_noise/B) per step count."""
    return (1 + factor * batch / b_noise) / (1 + batch / b_noise)


def summary_line(record: dict) -> str:
    """The measurement in one sentence, for the report."""
    window, choice = record["window"], record["choice"]
    times = ", ".join(
        f"{b}: {1000 * t:.1f} ms" for b, t in sorted(record["step_times"].items(), key=lambda kv: int(kv[0]))
    )
    return (
        f"Gradient noise scale along `{BASELINE}`'s run (`python -m gpt.noise_scale`): B_simple grows from "
        f"{next(p['b_simple'] for p in record['curve'] if p['b_simple'] is not None):.0f} to "
        f"{record['curve'][-1]['b_simple']:.0f} samples as the loss falls; over the last quarter, where the target "
        f"is reached, B_noise = {window['b_noise']:.0f} samples against the baseline's batch of "
        f"{record['batch_size']}. Step times with `{TIMED_WITH}`'s code ({times}) make batch {choice['batch']} "
        f"the one that minimises the predicted time to a loss, (1 + B_noise/B) t(B): {choice['speedup']:.2f}x "
        f"sooner than batch {record['batch_size']}, on {choice['tokens_factor']:.2f}x the tokens. The book's "
        f"batch x8 ({8 * record['batch_size']}) needs {tokens_factor(window['b_noise'], record['batch_size'], 8):.2f}x "
        "the tokens by the same model."
        + (
            f" The curve and B_noise were {reused_note(record, plural=True)}; the step times are this run's."
            if was_reused(record)
            else ""
        )
    )


def print_summary(record: dict) -> None:
    curve, window, choice = record["curve"], record["window"], record["choice"]
    shown = curve[:: max(1, len(curve) // 10)] + ([curve[-1]] if (len(curve) - 1) % max(1, len(curve) // 10) else [])
    print(f"{'tokens':>11}{'val loss':>10}{'B_simple':>10}")
    for p in shown:
        b = f"{p['b_simple']:.1f}" if p["b_simple"] is not None else "-"
        print(f"{p['tokens']:>11,}{p['val_loss']:>10.3f}{b:>10}")
    print(f"B_noise = {window['b_noise']:.1f} samples ({window['b_noise_tokens']:,.0f} tokens): {window['rule']}")
    print(
        f"{'batch':>7}{'step s':>9}{'pred. time':>12}   (time to a loss relative to batch "
        f"{record['batch_size']}: (1 + B_noise/B) t(B))"
    )
    for b, t in sorted(record["step_times"].items()):
        print(f"{b:>7}{t:>9.4f}{choice['relative_time'][b]:>12.3f}")
    s = choice["suggested"]
    print(
        f"chosen batch {choice['batch']}: predicted {choice['speedup']:.2f}x sooner than batch "
        f"{record['batch_size']} (tokens x{choice['tokens_factor']:.2f}); start the lr sweep at {s['lr']:.2e} "
        f"(square-root rule), beta2 {s['beta2']:.4f}"
    )


if __name__ == "__main__":
    raise SystemExit(main())

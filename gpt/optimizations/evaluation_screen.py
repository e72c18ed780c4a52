"""Evaluations skipped while the last step's training loss is far above the target: windows read only near it.

speedrun_22. A run that stops at its target evaluates at every interval, and far above the target each evaluation
reads the estimate's windows (gpt/evaluation.py: TowardTarget) only to find the loss clearly above it: on 2 CPU cores
those forwards are a quarter of the evaluations' seconds, and the evaluations a quarter of a first run. The training
loss of the last step is already computed, and while it exceeds the target by more than FAR_MARGIN the evaluation is
skipped: no window read, no point on the curve, the training untouched. The crossing is read at the same
evaluations as without the screen wherever the training loss at the crossing and at the evaluation before it is less
than FAR_MARGIN above the target. The first evaluation after a skipped one has no previous loss to measure a fall from
(TowardTarget.skip).

Where the run trains its whole budget (--full-budget, or a ladder that does not stop at its target) every evaluation
is read: the curve is the product there.
"""

from gpt.config import TrainConfig
from gpt.optimizations.optimization import Optimization, check_flag

# In nats of cross-entropy. Where the loss is this far above the target it still falls about a tenth a step, so a
# skipped evaluation stays two steps and the noise of one step's training loss away from the crossing; at every crossing
# in the committed speedrun records, and at the evaluation before it, the training loss is within a hundredth of the
# target (tests/optimizations/test_evaluation_screen.py reads them; chosen in docs/speedrun.md's log of 2026-12-03).
FAR_MARGIN = 0.5


def screens(cfg: TrainConfig) -> bool:
    """Whether the run's evaluations are screened: the flag on, and a run that stops at its target."""
    return cfg.eval_near_target_only and cfg.stop_at_target and cfg.target_loss is not None


def far_above_target(train_loss: float | None, target: float) -> bool:
    """Whether the last step's training loss is above `target` by more than FAR_MARGIN (None, before a step: no)."""
    return train_loss is not None and train_loss - FAR_MARGIN > target


def _check(cfg: TrainConfig) -> None:
    check_flag(cfg, "eval_near_target_only")


EVAL_NEAR_TARGET = Optimization(
    name="evaluations only near the target",
    fields=("eval_near_target_only",),
    code="gpt/optimizations/evaluation_screen.py:far_above_target (called by gpt/time_to_loss.py:evaluation_of)",
    checks=_check,
)

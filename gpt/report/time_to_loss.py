"""The report's "Time to loss" section: the speed and fast stages trained from scratch to one token budget
(gpt/time_to_loss.py, records in <runs>/time_to_loss/), each stage's time to the target validation loss beside its
time per sample, its final validation loss against the baseline's seed spread, and findings for every stage whose
per-step gain does not carry over to the model it trains."""
from pathlib import Path

from gpt.ladder import LADDERS, TRAINED_TO_A_LOSS, load_stage, parent_of
from gpt.records import read_record, record_path, time_to_loss_dir
from gpt.report.formatting import fmt_num, fmt_pct, table
from gpt.report.plots import pyplot
from gpt.report.rows import ok
from gpt.report.where_time_goes import NO_GAIN_PCT
from gpt.time_to_loss import (BASELINE_SEEDS, TARGET_AT, changes_convergence, crossing, seed_spread, target_from,
                              val_loss_at)

BASELINE = LADDERS[TRAINED_TO_A_LOSS[0]][0]  # speed_0_baseline: the target and the seeds come from it


class LossRuns:
    """The records of a run directory's training to a loss, and what the section reads from them."""

    def __init__(self, runs: Path):
        folder = time_to_loss_dir(runs)
        self.stages = [s for ladder in TRAINED_TO_A_LOSS for s in LADDERS[ladder]]
        self.records = {s: r for s in self.stages if (r := read_record(record_path(folder, s)))}
        self.seeds = [r for r in (read_record(p) for p in sorted(folder.glob(f"{BASELINE}.seed*.json"))) if ok(r)]
        base = self.records.get(BASELINE)
        self.target = target_from(base) if ok(base) else None
        baselines = ([base] if ok(base) else []) + self.seeds
        finals = [r["metrics"]["val_loss_final"] for r in baselines]
        self.spread = seed_spread(finals) if len(finals) > 1 else None
        # the run-to-run variation of a rate: the baseline's runs differ in seed only, not in speed
        rates = [r["metrics"]["tokens_per_s"] for r in baselines]
        self.rate_noise_pct = 100 * (max(rates) - min(rates)) / min(rates) if len(rates) > 1 else 0.0

    def final(self, stage: str) -> float | None:
        r = self.records.get(stage)
        return r["metrics"]["val_loss_final"] if ok(r) else None

    def to_target(self, stage: str) -> dict | None:
        """Where the stage's curve reaches the baseline's target (recomputed from the curve)."""
        r = self.records.get(stage)
        return crossing(r["metrics"]["curve"], self.target) if ok(r) and self.target is not None else None

    def vs_parent(self, stage: str) -> tuple[float | None, float | None]:
        """(seconds for the parent to reach its own loss at TARGET_AT of its budget, seconds for the stage to
        reach that same loss): how much sooner this change gives the parent's model."""
        r, p = self.records.get(stage), self.records.get(parent_of(stage) or "")
        if not (ok(r) and ok(p)):
            return None, None
        curve = p["metrics"]["curve"]
        loss = val_loss_at(curve, TARGET_AT * curve[-1]["tokens"])
        mine, theirs = crossing(r["metrics"]["curve"], loss), crossing(curve, loss)
        return (theirs or {}).get("seconds"), (mine or {}).get("seconds")

    def convergence(self, stage: str) -> str:
        """The final validation loss against the parent's: the difference, marked when beyond the seeds' spread."""
        final, parent = self.final(stage), self.final(parent_of(stage) or "")
        if final is None or parent is None:
            return ""
        d = final - parent
        if self.spread is not None and changes_convergence(final, parent, self.spread):
            return f"**changes convergence** ({d:+.3f})"
        return f"{d:+.3f}"


def speedup(base_s: float | None, mine_s: float | None) -> str:
    """How many times sooner than the base (seconds against seconds, or a rate's reciprocal)."""
    return "" if not base_s or not mine_s else f"{base_s / mine_s:.2f}x"


def loss_table(runs: LossRuns) -> list[str]:
    base = runs.records.get(BASELINE)
    base_rate = base["metrics"]["tokens_per_s"] if ok(base) else None
    base_target = runs.to_target(BASELINE)
    spread = "" if runs.spread is None else f" ± {runs.spread / 2:.3f}"
    rows = []
    for stage in runs.stages:
        r = runs.records.get(stage)
        change = "baseline (the settings above)" if stage == BASELINE else load_stage(stage).CHANGE
        if not ok(r):
            status = "not run" if r is None else f"**{r.get('status')}**: {r.get('reason', '')}"
            rows.append([stage, change, status] + [""] * 7)
            continue
        m, reached = r["metrics"], runs.to_target(stage)
        parent_s, mine_s = runs.vs_parent(stage)
        rows.append([
            stage, change, f"{m['tokens_per_s']:,.0f}" + (" (no effect)" if r.get("no_effect") else ""),
            f"{m['val_loss_final']:.3f}{spread}",
            runs.convergence(stage),
            fmt_num(reached["seconds"]) if reached else f"not reached ({m['val_loss_final']:.3f} at the end)",
            speedup(base_target and base_target["seconds"], reached and reached["seconds"]),
            speedup(1 / base_rate if base_rate else None, 1 / m["tokens_per_s"]),
            speedup(parent_s, mine_s) if mine_s else ("not reached" if parent_s else ""),
            f"{m['startup_s']:.1f}",
        ])
    return table(["stage", "change", "tokens/s", "final val loss", "vs parent's", "s to target",
                  f"speedup to target (vs {BASELINE[:7]})", "speedup per sample", "vs parent: to its loss",
                  "start-up s (apart)"], rows)


def loss_findings(runs: LossRuns) -> list[str]:
    """One line for every stage whose per-sample gain over its parent does not carry over to the time to its
    parent's model, or whose final loss is beyond the seeds' spread from its parent's (marked "changes
    convergence"), read from the two curves: fewer optimizer steps per token, or a changed final loss."""
    lines = []
    for stage in runs.stages:
        r, p = runs.records.get(stage), runs.records.get(parent_of(stage) or "")
        if not (ok(r) and ok(p)):
            continue
        m, pm = r["metrics"], p["metrics"]
        rate = m["tokens_per_s"] / pm["tokens_per_s"]
        parent_s, mine_s = runs.vs_parent(stage)
        to_loss = parent_s / mine_s if parent_s and mine_s else None
        gained = (not r.get("no_effect") and rate >= 1 + max(NO_GAIN_PCT, runs.rate_noise_pct) / 100
                  and (to_loss is None or to_loss < 0.9 * rate))
        changed = runs.spread is not None and changes_convergence(m["val_loss_final"], pm["val_loss_final"],
                                                                  runs.spread)
        if not (gained or changed):
            continue
        why = []
        if m["steps"] != pm["steps"]:
            why.append(f"{m['steps']:,} optimizer steps for the budget against {pm['steps']:,} "
                       f"({pm['steps'] / m['steps']:.3g}x fewer per token)")
        if changed:
            why.append(f"its final validation loss is {m['val_loss_final']:.3f} against {pm['val_loss_final']:.3f}, "
                       f"beyond the seeds' spread of {runs.spread:.3f}")
        outcome = (f"reaches its parent's loss {to_loss:.2f}x as fast" if to_loss is not None
                   else "does not reach its parent's loss within the budget")
        lead = (f"trains {fmt_pct(100 * (rate - 1))} faster per sample than `{p['stage']}` but" if gained
                else f"({fmt_pct(100 * (rate - 1))} tokens/s against `{p['stage']}`)")
        lines.append(f"`{stage}` {lead} {outcome}: " + ("; ".join(why) or "its curve falls more slowly per token")
                     + ".")
    return lines


def plot_curves(runs: LossRuns, path: Path) -> bool:
    """Validation loss against training seconds and against tokens, one line per stage (the baseline's other
    seeds thin and grey), the target dashed. False: nothing to plot."""
    finished = [(s, runs.records[s]) for s in runs.stages if ok(runs.records.get(s))]
    if not finished:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.2), sharey=True)
    colors = plt.get_cmap("tab20").colors
    for ax, x, label in ((axes[0], "seconds", "training seconds (start-up and evaluations excluded)"),
                         (axes[1], "tokens", "training tokens")):
        for seed in runs.seeds:
            curve = seed["metrics"]["curve"]
            ax.plot([p[x] for p in curve], [p["val_loss"] for p in curve], color="0.7", lw=0.8)
        for i, (stage, r) in enumerate(finished):
            curve = r["metrics"]["curve"]
            ax.plot([p[x] for p in curve], [p["val_loss"] for p in curve], color=colors[i % len(colors)],
                    lw=2 if stage == BASELINE else 1.2, label=stage.replace("_", " "))
        if runs.target is not None:
            ax.axhline(runs.target, color="black", ls="--", lw=0.8, label=f"target {runs.target:.3f}")
        ax.set_xlabel(label)
        ax.set_title(f"validation loss against {x}")
    axes[0].set_ylabel("validation loss")
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def loss_section(runs: LossRuns, plots: Path, rel: str) -> list[str]:
    """The whole section; [] when the run has no stage trained to a loss."""
    if not runs.records:
        return []
    base = runs.records.get(BASELINE)
    shown = base if ok(base) else next(iter(runs.records.values()))
    lines = ["", "## Time to loss", "", intro(runs, shown.get("config", {}), shown.get("metrics") or {}), ""]
    lines += loss_table(runs)
    notes = loss_findings(runs) + [
        "The memory and lean ladders are not trained here: each of their stages keeps its parent's trajectory "
        "(tests/test_ladder_equivalence.py, tests/test_beyond_equivalence.py), so its time to loss is its time per "
        "token, in the tables above. `lean_1_fsdp_bf16` computes in bf16 and so changes the numerics; it is not "
        "trained either: at GPT-2-large's depth its run to a loss would take longer than the whole ladder here."]
    lines += [""] + [f"- {n}" for n in notes]
    if plot_curves(runs, plots / "time_to_loss.png"):
        lines += ["", f"![validation loss against time and tokens]({rel}/time_to_loss.png)"]
    return lines


def intro(runs: LossRuns, cfg: dict, metrics: dict) -> str:
    """How the section's figures were made, from the baseline's own settings and run."""
    target = (f"The target, {runs.target:.3f}, is `{BASELINE}`'s validation loss {TARGET_AT:.0%} of the way "
              "through its budget" if runs.target is not None else f"`{BASELINE}` did not finish: there is no target")
    spread = (f"`{BASELINE}` also trained with {len(runs.seeds)} more seed(s): the final validation losses of its "
              f"{len(runs.seeds) + 1} seeds span {runs.spread:.3f}, the run-to-run spread (± half of it in the "
              "table); a stage whose final loss differs from its parent's by more is marked **changes convergence**. "
              f"Their rates differ by {runs.rate_noise_pct:.0f}%: one run of a stage is no more precise than that, "
              "and a stage marked (no effect) runs its parent's code on this device"
              if runs.spread is not None else f"the baseline's {BASELINE_SEEDS} seeds are not all recorded")
    return (f"Every stage of the speed and fast ladders trained from scratch on {cfg.get('train_tokens', 0):,} tokens "
            f"of character-level Shakespeare (block {cfg.get('block_size')}, "
            f"{metrics.get('tokens', 0) // max(1, metrics.get('steps', 1)):,} tokens per step before `speed_1`'s "
            f"batch x8), with a linear warm-up and a cosine decay of the learning rate "
            f"({cfg.get('lr')} to {cfg.get('min_lr')}), evaluated every {cfg.get('eval_every_tokens', 0):,} tokens on "
            f"the same {cfg.get('eval_windows')} held-out windows. {target}. {spread}. Seconds are training seconds: "
            "the evaluations and the first step's start-up (compilation, DataLoader workers), given apart, are not "
            "in them. 'speedup per sample' is the stage's tokens/s over the baseline's in these runs; 'vs parent: "
            "to its loss' is how much sooner the stage reaches its parent's loss at the same point of the budget: "
            "the model its parent trains, sooner.")

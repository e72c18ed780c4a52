"""The report's "Time to loss" section: the speed and fast stages trained from scratch to one token budget.

Each stage's time to the target beside its time per sample, its final loss against the seeds' spread, and findings
for every stage whose per-step gain does not carry over to the model it trains.
"""

from pathlib import Path

from gpt.formatting import fmt_num, fmt_pct, table
from gpt.ladder import LADDERS, declaration, ladder_names, ladder_of, parent_of, stages_of
from gpt.loss_curve import (
    BASELINE_SEEDS,
    TARGET_AT,
    changes_convergence,
    crossing,
    seed_spread,
    target_from,
    val_loss_at,
)
from gpt.records import read_record, record_path, time_to_loss_dir
from gpt.report.plots import pyplot, save_figure
from gpt.report.rows import ok
from gpt.report.tables import columns_line
from gpt.report.where_time_goes import NO_GAIN_PCT

BASELINE = stages_of(*ladder_names("also"))[0]  # speed_0_baseline: the target and the seeds come from it


class LossRuns:
    """The records of a run directory's training to a loss, and what the section reads from them."""

    def __init__(self, runs: Path):
        folder = time_to_loss_dir(runs)
        self.stages = stages_of(*ladder_names("also"))
        self.records = {s: r for s in self.stages if (r := read_record(record_path(folder, s)))}
        self.seeds = [r for r in (read_record(p) for p in sorted(folder.glob(f"{BASELINE}.seed*.json"))) if ok(r)]
        base = self.records.get(BASELINE)
        self.target = target_from(base) if ok(base) else None
        baselines = ([base] if ok(base) else []) + self.seeds
        finals = [r["metrics"]["val_loss_final"] for r in baselines]
        self.spread = seed_spread(finals) if len(finals) > 1 else None
        # the run-to-run variation of a rate: the baseline's runs differ in seed only, not in speed
        self.baseline_rates = [r["metrics"]["tokens_per_s"] for r in baselines]  # tokens a second, a seed each
        rates = self.baseline_rates
        self.rate_noise_pct = 100 * (max(rates) - min(rates)) / min(rates) if len(rates) > 1 else 0.0

    def final(self, stage: str) -> float | None:
        r = self.records.get(stage)
        return r["metrics"]["val_loss_final"] if ok(r) else None

    def to_target(self, stage: str) -> dict | None:
        """Where the stage's curve reaches the baseline's target (recomputed from the curve)."""
        r = self.records.get(stage)
        return crossing(r["metrics"]["curve"], self.target) if ok(r) and self.target is not None else None

    def vs_parent(self, stage: str) -> tuple[float | None, float | None]:
        """How much sooner this change gives the parent's model: vs(stage, parent)."""
        return self.vs(stage, parent_of(stage) or "")

    def vs(self, stage: str, other: str) -> tuple[float | None, float | None]:
        """Seconds for `other` to reach its own loss (at TARGET_AT of its budget), and for the stage to reach it."""
        r, o = self.records.get(stage), self.records.get(other)
        if not (ok(r) and ok(o)):
            return None, None
        loss = self.loss_of(other)
        mine, theirs = crossing(r["metrics"]["curve"], loss), crossing(o["metrics"]["curve"], loss)
        return (theirs or {}).get("seconds"), (mine or {}).get("seconds")

    def loss_of(self, stage: str) -> float:
        """The loss that stands for the model a stage trains: its validation loss at TARGET_AT of its budget."""
        curve = self.records[stage]["metrics"]["curve"]
        return val_loss_at(curve, TARGET_AT * curve[-1]["tokens"])

    def changes(self, stage: str) -> bool:
        """Whether it is marked "changes convergence": its final loss beyond the seeds' spread from its parent's."""
        final, parent = self.final(stage), self.final(parent_of(stage) or "")
        return None not in (final, parent, self.spread) and changes_convergence(final, parent, self.spread)

    def kept_model(self, stage: str) -> str | None:
        """The model a stage trains: the nearest earlier stage marked "changes convergence" (None: the baseline's)."""
        earlier = parent_of(stage)
        while earlier and not self.changes(earlier):
            earlier = parent_of(earlier)
        return earlier

    def kept_models(self) -> list[str]:
        """The stages whose model later stages keep, in ladder order."""
        return list(dict.fromkeys(k for s in self.stages if (k := self.kept_model(s))))

    def convergence(self, stage: str) -> str:
        """The final validation loss against the parent's: the difference, marked when beyond the seeds' spread."""
        final, parent = self.final(stage), self.final(parent_of(stage) or "")
        if final is None or parent is None:
            return ""
        return f"**changes convergence** ({final - parent:+.3f})" if self.changes(stage) else f"{final - parent:+.3f}"


def speedup(base_s: float | None, mine_s: float | None) -> str:
    """How many times sooner than the base (seconds against seconds, or a rate's reciprocal)."""
    return "" if not base_s or not mine_s else f"{base_s / mine_s:.2f}x"


def loss_table(runs: LossRuns) -> list[str]:
    """The section's table, one row per stage (columns: docs/measurement.md); tokens/s and start-up: loss_details."""
    base = runs.records.get(BASELINE)
    base_rate = base["metrics"]["tokens_per_s"] if ok(base) else None
    base_target = runs.to_target(BASELINE)
    spread = "" if runs.spread is None else f" ± {runs.spread / 2:.3f}"
    rows = []
    for stage in runs.stages:
        r = runs.records.get(stage)
        change = "baseline (the settings above)" if stage == BASELINE else declaration(stage).change
        if not ok(r):
            status = "not run" if r is None else f"**{r.get('status')}**: {r.get('reason', '')}"
            rows.append([stage, change, status] + [""] * 4)
            continue
        m, reached = r["metrics"], runs.to_target(stage)
        parent_s, mine_s = runs.vs_parent(stage)
        convergence = runs.convergence(stage).replace("** (", "**, ").removesuffix(")")  # inside the brackets
        rows.append(
            [
                stage,
                change,
                f"{m['val_loss_final']:.3f}{spread}" + (f" ({convergence})" if convergence else ""),
                f"{fmt_num(reached['seconds'])} ({speedup(base_target and base_target['seconds'], reached['seconds'])})"
                if reached
                else f"not reached ({m['val_loss_final']:.3f} at the end)",
                speedup(1 / base_rate if base_rate else None, 1 / m["tokens_per_s"])
                + (" (no effect)" if r.get("no_effect") else ""),
                speedup(parent_s, mine_s) if mine_s else ("not reached" if parent_s else ""),
                vs_kept_model(runs, stage),
            ]
        )
    return table(
        [
            "stage",
            "change",
            "final val loss (vs parent's)",
            f"s to target (speedup vs {BASELINE[:7]})",
            "speedup per sample",
            "vs parent: to its loss",
            "vs the model it keeps: to its loss",
        ],
        rows,
    )


def loss_details(runs: LossRuns) -> list[str]:
    """The secondary columns, folded: each stage's tokens/s, optimizer steps and start-up seconds."""
    rows = [
        [
            stage,
            f"{r['metrics']['tokens_per_s']:,.0f}",
            "" if (steps := r["metrics"].get("steps")) is None else f"{steps:,}",
            "" if (startup := r["metrics"].get("startup_s")) is None else f"{startup:.1f}",
        ]
        for stage in runs.stages
        if ok(r := runs.records.get(stage))
    ]
    if not rows:
        return []
    return [
        "",
        "<details><summary>Tokens/s, optimizer steps and start-up per stage</summary>",
        "",
        *table(["stage", "tokens/s", "optimizer steps", "start-up s (apart)"], rows),
        "",
        "</details>",
    ]


def vs_kept_model(runs: LossRuns, stage: str) -> str:
    """How much sooner the stage reaches the loss of the model it keeps than the stage that made that model."""
    kept = runs.kept_model(stage)
    if kept is None or runs.changes(stage):  # a stage that changes the model keeps none
        return ""
    theirs, mine = runs.vs(stage, kept)
    return f"{speedup(theirs, mine)} vs `{kept[:7]}`" if mine else (f"not reached (`{kept[:7]}`'s)" if theirs else "")


def loss_findings(runs: LossRuns) -> list[str]:
    """A line for every stage whose per-sample gain does not carry over to its parent's model, or whose loss changed.

    Read from the two curves: fewer optimizer steps per token, or a final loss beyond the seeds' spread."""
    lines = []
    for stage in runs.stages:
        r, p = runs.records.get(stage), runs.records.get(parent_of(stage) or "")
        if not (ok(r) and ok(p)):
            continue
        m, pm = r["metrics"], p["metrics"]
        rate = m["tokens_per_s"] / pm["tokens_per_s"]
        parent_s, mine_s = runs.vs_parent(stage)
        to_loss = parent_s / mine_s if parent_s and mine_s else None
        gained = (
            not r.get("no_effect")
            and rate >= 1 + max(NO_GAIN_PCT, runs.rate_noise_pct) / 100
            and (to_loss is None or to_loss < 0.9 * rate)
        )
        changed = runs.changes(stage)
        if not (gained or changed):
            continue
        why = []
        if m["steps"] != pm["steps"]:
            why.append(
                f"{m['steps']:,} optimizer steps for the budget against {pm['steps']:,} "
                f"({pm['steps'] / m['steps']:.3g}x fewer per token)"
            )
        if changed:
            why.append(
                f"its final validation loss is {m['val_loss_final']:.3f} against {pm['val_loss_final']:.3f}, "
                f"beyond the seeds' spread of {runs.spread:.3f}"
            )
        outcome = (
            f"reaches its parent's loss {to_loss:.2f}x as fast"
            if to_loss is not None
            else "does not reach its parent's loss within the budget"
        )
        lead = (
            f"trains {fmt_pct(100 * (rate - 1))} faster per sample than `{p['stage']}` but"
            if gained
            else f"({fmt_pct(100 * (rate - 1))} tokens/s against `{p['stage']}`)"
        )
        lines.append(
            f"`{stage}` {lead} {outcome}: " + ("; ".join(why) or "its curve falls more slowly per token") + "."
        )
    return lines


def kept_model_findings(runs: LossRuns) -> list[str]:
    """One line for every stage whose model later stages keep: how much sooner they, and the baseline, reach its loss.

    The last stage keeping it, the stage its ladder starts from, and the baseline, whose curve passes through that loss
    too: the gains of the stages that keep the mathematics, as time to a model."""
    lines = []
    for kept in runs.kept_models():
        keeping = [
            s for s in runs.stages if runs.kept_model(s) == kept and not runs.changes(s) and ok(runs.records.get(s))
        ]
        theirs, _ = runs.vs(kept, kept)
        if not keeping or not theirs:
            continue
        times = {s: runs.vs(s, kept)[1] for s in keeping}  # each keeping stage's seconds to that loss
        last, start = keeping[-1], LADDERS[ladder_of(keeping[-1])].starts_from
        reached = [
            f"by `{s}` in {fmt_num(times[s])} s ({speedup(theirs, times[s])} as fast)"
            if times[s]
            else f"not by `{s}` within the budget"
            for s in [last] + ([start] if start in keeping else [])
        ]
        after = f"{len(keeping)} stages after it keep" if len(keeping) > 1 else "stage after it keeps"
        _, base_s = runs.vs(BASELINE, kept)  # the baseline's own model passes through that loss too
        soonest = min((t for t in times.values() if t), default=None)
        baseline = (
            ""
            if not base_s
            else f"; `{BASELINE}` reaches it in {fmt_num(base_s)} s"
            + (", sooner than every stage that keeps it" if soonest is None or base_s < soonest else "")
        )
        lines.append(
            f"`{kept}` trains another model than its parent (marked changes convergence), and the {after} "
            f"that model: each is also timed to `{kept}`'s loss at "
            f"{TARGET_AT:.0%} of its budget, {runs.loss_of(kept):.3f}, which `{kept}` reaches in "
            f"{fmt_num(theirs)} s; it is reached " + " and ".join(reached) + baseline + "."
        )
    return lines


def plot_curves(runs: LossRuns, stages: list[str], path: Path, title: str) -> bool:
    """Validation loss against training seconds and tokens for `stages` (one ladder, with the baseline); False: none."""
    finished = [(s, runs.records[s]) for s in stages if ok(runs.records.get(s))]
    if not finished:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), sharey=True)
    colors = plt.get_cmap("tab10").colors
    for ax, x, label in (
        (axes[0], "seconds", "training seconds (start-up and evaluations excluded)"),
        (axes[1], "tokens", "training tokens"),
    ):
        for seed in runs.seeds:
            curve = seed["metrics"]["curve"]
            ax.plot(
                [p[x] for p in curve],
                [p["val_loss"] for p in curve],
                color="0.7",
                lw=0.8,
                label=f"{BASELINE.replace('_', ' ')}, seed {seed.get('seed', '?')}",
            )
        for i, (stage, r) in enumerate(finished):
            curve = r["metrics"]["curve"]
            ax.plot(
                [p[x] for p in curve],
                [p["val_loss"] for p in curve],
                color=colors[i % len(colors)],
                lw=2 if stage == BASELINE else 1.2,
                label=stage.replace("_", " ") + (f", seed {r.get('seed')}" if stage == BASELINE else ""),
            )
        if runs.target is not None:
            ax.axhline(runs.target, color="black", ls="--", lw=0.8, label=f"target {runs.target:.3f}")
        for kept in runs.kept_models():
            ax.axhline(
                runs.loss_of(kept), color="black", ls=":", lw=0.8, label=f"{kept[:7]}'s model {runs.loss_of(kept):.3f}"
            )
        ax.set_xlabel(label)
        ax.set_title(f"validation loss against {x}")
    axes[0].set_ylabel("validation loss")
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(title)
    save_figure(fig, path)
    return True


def no_effect_findings(runs: LossRuns, timed: dict[str, dict]) -> list[str]:
    """A line for every stage marked (no effect) here but not in its timed table: the reason, and the shapes."""
    lines = []
    for stage in runs.stages:
        r, t = runs.records.get(stage), timed.get(stage)
        if not (ok(r) and r.get("no_effect") and ok(t) and not t.get("no_effect")):
            continue
        mine, theirs = r["model"], t["model"]
        lines.append(
            f"`{stage}` is marked (no effect) here but not in the {ladder_of(stage)} ladder's table above: "
            f"{r['no_effect']}. The model trained here has {mine['n_layer']} layers x {mine['n_embd']}, "
            f"vocabulary {mine['vocab_size']}, block {mine['block_size']}; the timed ladder's has "
            f"{theirs['n_layer']} x {theirs['n_embd']}, vocabulary {theirs['vocab_size']}, block "
            f"{theirs['block_size']}."
        )
    return lines


def loss_section(runs: LossRuns, plots: Path, rel: str, timed: dict[str, dict] | None = None) -> list[str]:
    """The whole section ([] without a stage trained to a loss); `timed`: the ladders' records, to compare effects."""
    if not runs.records:
        return []
    base = runs.records.get(BASELINE)
    shown = base if ok(base) else next(iter(runs.records.values()))
    lines = ["", "## Time to loss", "", intro(runs, shown.get("config", {}), shown.get("metrics") or {}), ""]
    lines += loss_table(runs)
    lines += ["", columns_line("time_to_loss")]
    lines += loss_details(runs)
    notes = (
        loss_findings(runs)
        + kept_model_findings(runs)
        + no_effect_findings(runs, timed or {})
        + [
            "The memory and lean ladders are not trained here: each of their stages keeps its parent's trajectory "
            "(the equivalence tests of their homes, tests/optimizations/), so its time to loss is its time per "
            "token, in the tables above. `lean_1_fsdp_bf16` computes in bf16 and so changes the numerics; it is not "
            "trained either: at GPT-2-large's depth its run to a loss would take longer than the whole ladder here."
        ]
    )
    lines += [""] + [f"- {n}" for n in notes]
    for ladder in ladder_names("also"):
        start = LADDERS[ladder].starts_from
        stages = list(dict.fromkeys([BASELINE, *([start] if start else []), *stages_of(ladder)]))
        name = f"time_to_loss_{ladder}.png"
        if not any(ok(runs.records.get(s)) for s in stages_of(ladder)):
            continue  # none of the ladder's own stages trained: no figure of the baseline alone
        if plot_curves(runs, stages, plots / name, f"{ladder.capitalize()} ladder trained to a loss"):
            lines += ["", f"![{ladder} ladder: validation loss against time and tokens]({rel}/{name})"]
    return lines


def intro(runs: LossRuns, cfg: dict, metrics: dict) -> str:
    """How the section's figures were made, from the baseline's own settings and run."""
    target = (
        f"The target, {runs.target:.3f}, is `{BASELINE}`'s validation loss {TARGET_AT:.0%} of the way "
        "through its budget"
        if runs.target is not None
        else f"`{BASELINE}` did not finish: there is no target"
    )
    spread = (
        f"`{BASELINE}` also trained with {len(runs.seeds)} more seed(s): the final validation losses of its "
        f"{len(runs.seeds) + 1} seeds span {runs.spread:.3f}, the run-to-run spread (± half of it in the "
        "table); a stage whose final loss differs from its parent's by more is marked **changes convergence**. "
        f"Their rates differ by {runs.rate_noise_pct:.0f}%: one run of a stage is no more precise than that, "
        "and a stage marked (no effect) runs its parent's code on this device"
        if runs.spread is not None
        else f"the baseline's {BASELINE_SEEDS} seeds are not all recorded"
    )
    return (
        f"Every stage of the speed and fast ladders trained from scratch on {cfg.get('train_tokens', 0):,} tokens "
        f"of character-level Shakespeare (block {cfg.get('block_size')}, "
        f"{metrics.get('tokens', 0) // max(1, metrics.get('steps', 1)):,} tokens per step before `speed_1`'s "
        f"batch x8), with a linear warm-up and a cosine decay of the learning rate "
        f"({cfg.get('lr')} to {cfg.get('min_lr')}), evaluated every {cfg.get('eval_every_tokens', 0):,} tokens on "
        f"the same {cfg.get('eval_windows')} held-out windows. {target}. {spread}. Seconds are training seconds: "
        "the evaluations and the start-up (compilation, DataLoader workers, the recording of CUDA graphs), given "
        "apart, are not in them."
    )

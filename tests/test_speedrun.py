"""The speedrun ladder: its plumbing, target and judgement, its systems stage, and its last stage as the ladder runs it.

Its code: gpt/ladder.py "speedrun", stages/speedrun_*.py, run_all's section, the report's. Tested here: its plumbing,
its target and its judgement, the one claim of its systems stage, that it keeps the model, and its last stage trained as
the ladder runs it (here on the CPU; on CUDA, with its CUDA graphs, in tests/test_gpu.py). The training changes' own
mechanics are tested beside their homes (tests/optimizations/test_muon.py, test_schedule.py, test_architecture.py,
test_ngram_embedding.py) and the noise scale in tests/test_noise_scale.py."""

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO
from equivalence import NO_CLIP, real_rows, tiny_config, train_with_grads
from test_time_to_loss import learning_budget

from gpt import optimizations, run_all, time_to_loss, train
from gpt.committed_records import SPEEDRUN_TARGET_SET_BY, published_dir
from gpt.config import TrainConfig
from gpt.devices import resolve_device
from gpt.formatting import fmt_num
from gpt.ladder import STAGES_DIR, declaration, lineage, load_stage, stage_config, stages_of, trains_to_a_loss_only
from gpt.loss_curve import SPEEDRUN_SEEDS, baseline_model_loss
from gpt.optimizations import changed, chunked_loss, model_settings, why_cannot_run
from gpt.optimizations.compilation import compile_mode, uses_cuda_graphs
from gpt.records import read_record, record_path, speedrun_target, time_to_loss_dir, write_record
from gpt.report.speedrun import KINDS, Speedrun, speedrun_findings, speedrun_section, speedup_range

MEASUREMENT = REPO / "docs" / "measurement.md"

SPEEDRUN = stages_of("speedrun")


def test_every_speedrun_stage_trains_to_a_loss_on_the_baselines_settings():
    """A speedrun stage has no timed protocol: its config is speed_0's time-to-loss one with its changes."""
    base = stage_config("speed_0_baseline", "cpu", to_a_loss=True)
    for stage in SPEEDRUN:
        assert trains_to_a_loss_only(stage) and lineage(stage)[0] == "speed_0_baseline"
        cfg = stage_config(stage, "cpu")
        assert cfg.train_tokens and cfg.data_dir == base.data_dir and cfg.eval_windows == base.eval_windows
        declared = declaration(stage)
        assert declared.kind in KINDS and declared.change and declared.doc.startswith(f"Speedrun, stage {stage[9]}")
    assert not trains_to_a_loss_only("speed_0_baseline")


def test_the_systems_stage_changes_only_what_the_fast_ladder_proves_keeps_the_model():
    """The systems stage changes only what the fast ladder proves keeps the model.

    speedrun_1 switches on the changes of speed_4, speed_5 and fast_1..fast_6 and nothing else: not speed_1's batch, not
    the learning rate, not the budget."""
    base = stage_config("speed_0_baseline", "cpu", to_a_loss=True).to_dict()
    systems = stage_config("speedrun_1_systems", "cpu").to_dict()
    fast = stage_config("fast_6_chunked_loss", "cpu", to_a_loss=True).to_dict()
    allowed = set(changed(base, fast)) - set(changed(base, {**base, "batch_size": 96}))
    assert set(changed(base, systems)) <= allowed  # speed_2's workers and speed_3's pinning are fast_1's to replace
    assert len(changed(base, systems)) >= 8
    differ = {k for k in base if base[k] != systems[k]}
    assert not differ & {"batch_size", "lr", "min_lr", "betas", "train_tokens", "lr_decay_tokens", "seed"}


def test_the_systems_stage_computes_the_baselines_gradients(char_data):
    """The systems stage's settings give the baseline's first-step gradients, up to float32 reassociation.

    On a tiny model, with the same batch and the same weights, so the same gradients up to float32 reassociation (SDPA,
    the chunked loss and compile add up the same sums in another order: measured < 1e-6 of the largest gradient). A
    stage that changed the batch, the data or the loss would differ by the gradient's own size. goal="memory" keeps SDPA
    and the chunked loss whatever their speed here, so the changed code really runs; bf16 stays off (fp32 on this CPU
    unless bf16 is faster: then the check is bf16's, bounded in tests/optimizations/test_precision.py)."""
    common = dict(lr=1e-3, grad_clip=NO_CLIP, goal="memory")
    base = tiny_config(char_data, **common)
    systems = tiny_config(char_data, **common)
    load_stage("speedrun_1_systems").change(systems)
    systems.amp = systems.amp_bf16 = (
        False  # the precision's own bound is fast_2's test; here the rest must be exact to fp32
    )
    optimizations.validate(systems)
    assert systems.compile and systems.batch_gather and systems.loss == "chunked" and systems.attention == "sdpa"
    run_b, grads_b = train_with_grads(base, 1)
    run_s, grads_s = train_with_grads(systems, 1)
    vocab = run_b.gpt.config.vocab_size
    torch.testing.assert_close(real_rows(grads_s[0], vocab), real_rows(grads_b[0], vocab), rtol=1e-4, atol=1e-6)
    assert run_s.losses == pytest.approx(run_b.losses, rel=1e-5)


def _loss_record(stage: str, seed: int | None, curve: list[tuple[int, float, float]], status="ok") -> dict:
    points = [
        {"step": i, "tokens": t, "seconds": s, "val_loss": v, "train_loss": None, "lr": None}
        for i, (t, s, v) in enumerate(curve)
    ]
    return {
        "stage": stage,
        "ladder": "speedrun" if stage.startswith("speedrun") else "speed",
        "profile": "cpu",
        "status": status,
        "mode": "time_to_loss",
        "seed": seed,
        "device": {"name": "cpu", "type": "cpu", "count": 1},
        "metrics": {
            "curve": points,
            "train_seconds": points[-1]["seconds"],
            "tokens": points[-1]["tokens"],
            "val_loss_final": points[-1]["val_loss"],
            "val_loss_initial": points[0]["val_loss"],
            "tokens_per_s": points[-1]["tokens"] / max(points[-1]["seconds"], 1e-9),
            "target_loss": None,
            "startup_s": 0.0,
        },
    }


def test_the_target_is_the_highest_of_the_baselines_final_losses():
    """The worst seed's final loss, whatever its place in the list: a loss every baseline seed reaches."""
    finals = (1.95, 2.0, 1.9)
    records = [_loss_record("speed_0_baseline", s, [(0, 0, 4.0), (100, 10, f)]) for s, f in enumerate(finals)]
    assert baseline_model_loss(records) == 2.0
    assert baseline_model_loss(records[::-1]) == 2.0
    assert baseline_model_loss(records + [None]) is None
    assert baseline_model_loss(records + [{**records[0], "status": "failed"}]) is None


def write_speedrun(tmp_path, stage_curves: dict[str, list[list[tuple]]]):
    """Baseline seeds with finals 1.9 after 100 s and 2.1 after 120 s (target 2.1), and the given stages' seeds."""
    loss_dir, sr_dir = time_to_loss_dir(tmp_path), time_to_loss_dir(tmp_path, "speedrun")
    for i, (final, seconds) in enumerate(((1.9, 100.0), (2.1, 120.0))):
        name = "speed_0_baseline.json" if i == 0 else f"speed_0_baseline.seed{3408 + i}.json"
        write_record(loss_dir / name, _loss_record("speed_0_baseline", 3407 + i, [(0, 0, 4.0), (1000, seconds, final)]))
    for stage, seeds in stage_curves.items():
        for i, curve in enumerate(seeds):
            name = f"{stage}.json" if i == 0 else f"{stage}.seed{3407 + i}.json"
            write_record(sr_dir / name, _loss_record(stage, 3407 + i, curve))


def test_a_stage_is_timed_to_the_target_and_holds_only_if_every_seed_reaches_it(tmp_path):
    """A stage is timed to the target, and holds only if every seed reaches it.

    Target 2.1. speedrun_1 crosses it at 19 s (interpolated between 10 s at 3.0 and 30 s at 1.0: 19 s, 475 tokens);
    speedrun_2's second seed ends at 2.15: the stage does not hold. The baseline's seeds are timed to the target the
    same way: the better one at 1.9/2.1 of its 100 s, the worse one at the end of its 120 s."""
    write_speedrun(
        tmp_path,
        {
            "speedrun_1_systems": [[(0, 0, 4.0), (250, 10, 3.0), (750, 30, 1.0)]],
            "speedrun_2_batch_lr": [[(0, 0, 4.0), (400, 8, 1.5)], [(0, 0, 4.0), (400, 8, 2.15)]],
        },
    )
    sr = Speedrun(tmp_path)
    assert sr.target == pytest.approx(2.1)
    assert sr.seconds("speed_0_baseline") == [pytest.approx(100 * 1.9 / 2.1), pytest.approx(120.0)]
    assert sr.seconds("speedrun_1_systems") == [pytest.approx(19.0)]
    assert sr.tokens("speedrun_1_systems") == [pytest.approx(475.0)]
    assert sr.holds("speed_0_baseline") and sr.holds("speedrun_1_systems") and not sr.holds("speedrun_2_batch_lr")
    assert sr.seconds("speedrun_2_batch_lr")[1] is None
    text = "\n".join(speedrun_section(sr, tmp_path, "plots"))
    assert "speedrun_1_systems.json" in text and "5.54x" in text  # (90.48 + 120) / 2 / 19
    assert "1/2" in text and "not reached" in text  # speedrun_2: one seed of two


def test_the_findings_name_the_fewest_training_seconds_when_a_later_stage_gave_some_back(tmp_path):
    """The findings name the fewest training seconds when a later stage gave some back.

    speedrun_1 reaches the target 2.1 in 19 s, speedrun_2 (its last stage, which holds) in 25 s: the headline is
    speedrun_2's, and a second finding names speedrun_1's fewer seconds; with speedrun_2 at 15 s there is none."""
    slower = {
        "speedrun_1_systems": [[(0, 0, 4.0), (250, 10, 3.0), (750, 30, 1.0)]],
        "speedrun_2_batch_lr": [[(0, 0, 4.0), (400, 25, 2.1)]],
    }
    write_speedrun(tmp_path / "slower", slower)
    findings = speedrun_findings(Speedrun(tmp_path / "slower"))
    assert findings[0].startswith("`speedrun_2_batch_lr` reaches")
    assert len(findings) == 2 and "fewest training seconds are `speedrun_1_systems`'s, 19.0 s" in findings[1]
    write_speedrun(tmp_path / "faster", {**slower, "speedrun_2_batch_lr": [[(0, 0, 4.0), (400, 15, 2.1)]]})
    assert len(speedrun_findings(Speedrun(tmp_path / "faster"))) == 1


def test_the_table_gives_the_whole_wall_clock_beside_the_training_seconds(tmp_path):
    """The table gives each stage's whole wall clock beside its training seconds to the target.

    Each stage's whole wall clock (run_all's run.wall_s where the record has it, else the process's own process_s) and
    both ratios against speed_0's, whose seeds took 150 and 170 s of wall clock: speedrun_1's 40 s is 4.00x sooner.
    speedrun_3 has only its own process_s: its wall clock is shown but no ratio against speed_0's, measured from
    outside; speedrun_4's record has neither."""
    write_speedrun(
        tmp_path,
        {
            "speedrun_1_systems": [[(0, 0, 4.0), (250, 10, 3.0), (750, 30, 1.0)]],
            "speedrun_3_muon": [[(0, 0, 4.0), (400, 8, 1.5)]],
            "speedrun_4_architecture": [[(0, 0, 4.0), (400, 10, 1.5)]],
        },
    )
    loss_dir, sr_dir = time_to_loss_dir(tmp_path), time_to_loss_dir(tmp_path, "speedrun")
    walls = {
        loss_dir / "speed_0_baseline.json": 150.0,
        loss_dir / "speed_0_baseline.seed3409.json": 170.0,
        sr_dir / "speedrun_1_systems.json": 40.0,
    }
    for path, wall in walls.items():
        record = read_record(path)
        write_record(
            path,
            {
                **record,
                "run": {"quick": False, "wall_s": wall},
                "metrics": {**record["metrics"], "process_s": wall - 1},
            },
        )
    record = read_record(sr_dir / "speedrun_3_muon.json")
    write_record(sr_dir / "speedrun_3_muon.json", {**record, "metrics": {**record["metrics"], "process_s": 25.0}})
    lines = speedrun_section(Speedrun(tmp_path), tmp_path, "plots")
    header = next(line for line in lines if line.startswith("| # |"))
    assert header.count("|") - 1 <= 7 and "wall" in header and "training" in header
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in lines
        if line.startswith("| ") and not line.startswith("| # ")
    }
    # change, training s, wall s, x vs speed_0, tokens, record
    assert rows["0"][2:4] == ["160 (150-170); 1.00x", "1.00x"]
    # training: (90.48 + 120) / 2 / 19; wall: 160 / 40
    assert rows["1"][2:4] == ["40.0; 4.00x (3.75-4.25x)", "5.54x (4.76-6.32x)"]
    assert rows["3"][2] == "25.0 (the process's own)"
    assert rows["4"][2] == ""
    # which is which: defined once, in docs/measurement.md, which the line under the table links to
    assert (
        "Columns: [docs/measurement.md, The speedrun record table](docs/measurement.md#the-speedrun-record-table)."
        in lines
    )
    assert "`run.wall_s`" in MEASUREMENT.read_text() and "`process_s`" in MEASUREMENT.read_text()


def test_the_record_table_states_the_task_the_margin_and_the_record(tmp_path):
    """The record table states the task, each stage's margin and its record file, modded-nanogpt's way.

    The task in one line above the table; each stage's tokens to the target of its budget (its config's train_tokens)
    with the margin left, its factor against its parent beside the one against speed_0, and its record file. speedrun_1
    reaches 2.1 at 475 of its 1,000 tokens (52% left) in 19 s; speedrun_2 at 400 of its 500 in 8 s (20% left): 2.38x
    sooner than speedrun_1."""
    write_speedrun(
        tmp_path,
        {
            "speedrun_1_systems": [[(0, 0, 4.0), (250, 10, 3.0), (750, 30, 1.0), (1000, 40, 1.0)]],
            "speedrun_2_batch_lr": [[(0, 0, 4.0), (400, 8, 2.1), (500, 10, 2.0)]],
        },
    )
    sr_dir = time_to_loss_dir(tmp_path, "speedrun")
    for path, budget in ((sr_dir / "speedrun_1_systems.json", 1000), (sr_dir / "speedrun_2_batch_lr.json", 500)):
        record = read_record(path)
        write_record(path, {**record, "config": {"train_tokens": budget, "data_dir": "data/shakespeare_char"}})
    loss_dir = time_to_loss_dir(tmp_path)
    for path in loss_dir.glob("speed_0_baseline*.json"):
        record = read_record(path)
        config = {"train_tokens": 1000, "data_dir": "data/shakespeare_char", "block_size": 64, "eval_windows": 200}
        write_record(path, {**record, "config": config})
    lines = speedrun_section(Speedrun(tmp_path), tmp_path, "plots")
    task = next(line for line in lines if line.startswith("Task: "))
    assert "validation loss 2.100" in task and "`shakespeare_char` (block 64" in task and "on cpu (cpu)" in task
    assert lines.index(task) < next(i for i, line in enumerate(lines) if line.startswith("| # |"))
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
        for line in lines
        if line.startswith("| ") and not line.startswith("| # ")
    }
    assert rows["1"][4] == "475 of 1,000 (52% left)"
    assert rows["2"][4] == "400 of 500 (20% left)"
    assert rows["0"][4] == "952 (905-1,000) of 1,000 (0% left)"  # the worst seed's end is the target
    assert rows["2"][3].endswith("; 2.38x vs parent") and "vs parent" not in rows["1"][3]  # speed_0 is its parent
    assert rows["2"][5] == f"[{sr_dir / 'speedrun_2_batch_lr.json'}]({sr_dir / 'speedrun_2_batch_lr.json'})"
    assert rows["0"][5].endswith(" (+1 seeds)")
    assert (tmp_path / "speedrun_waterfall.png").read_bytes()[:4] == b"\x89PNG"
    assert (
        "![speedrun waterfall: training seconds to the target, stage by stage](plots/speedrun_waterfall.png)" in lines
    )


def test_the_speedup_range_is_taken_across_the_seeds():
    assert speedup_range([100.0, 120.0], [10.0, 20.0]) == "7.33x (5.00-12.00x)"
    assert speedup_range([100.0], [20.0]) == "5.00x"


def test_run_all_runs_the_baselines_seeds_then_the_speedrun_with_its_target(tmp_path, monkeypatch):
    """run_all runs the baseline's seeds, then the speedrun with the target from them.

    --only speedrun: speed_0's seeds first (nothing else of the time-to-loss section), the target from them, the noise
    scale, then each speedrun stage once and the last with every seed, each given the target."""
    calls = []

    def fake_run_stage(cmd, log, show, deadline=None):
        stage = cmd[1].rsplit("/", 1)[-1].removesuffix(".py")
        seed = int(cmd[cmd.index("--seed") + 1]) if "--seed" in cmd else None
        calls.append((stage, seed, cmd[cmd.index("--target-loss") + 1] if "--target-loss" in cmd else None))
        out = tmp_path / ("speedrun" if stage.startswith("speedrun") else "time_to_loss")
        name = f"{stage}.json" if seed is None else f"{stage}.seed{seed}.json"
        final = 2.0 + (0.1 * (seed - 3408) if seed else 0.0)
        write_record(out / name, _loss_record(stage, seed, [(0, 0, 4.0), (1000, 50, final)]))
        return 0

    monkeypatch.setattr(run_all, "run_stage", fake_run_stage)
    monkeypatch.setattr(run_all, "run_noise_scale", lambda *a: calls.append(("noise_scale", a[-1], None)))
    floor = lambda profile, target: calls.append(("floor", target, None)) or {}  # noqa: E731
    monkeypatch.setattr(run_all.ngram_floor, "measure", floor)  # counting the floor needs the prepared data
    monkeypatch.setattr(run_all, "measure_cpu_peaks", lambda *a: None)
    monkeypatch.setattr(run_all, "remeasure_cpu_peak", lambda *a: None)
    monkeypatch.setattr(run_all, "prepare_data", lambda *a: None)
    args = ["--only", "speedrun", "--profile", "cpu", "--device", "cpu", "--out", str(tmp_path), "--wandb", "disabled"]
    run_all.main(args)
    baseline = [c for c in calls if c[0] == "speed_0_baseline"]
    assert [c[1] for c in baseline] == [None, 3408, 3409] and all(c[2] is None for c in baseline)
    target = repr(max(2.0, 2.0, 2.0 + 0.1))  # the worst seed's final loss
    rest = calls[len(baseline) :]
    assert rest[0] == ("noise_scale", published_dir("cpu", "cpu") / "speedrun", None)  # the committed curve, if valid
    assert rest[1] == ("floor", 2.0 + 0.1, None)  # the n-gram floor, counted to the same target
    assert [c[0] for c in rest[2:]] == SPEEDRUN[:-1] + [SPEEDRUN[-1]] * SPEEDRUN_SEEDS
    assert all(c[2] == target for c in rest[2:])
    assert [c[1] for c in rest[-SPEEDRUN_SEEDS:]] == [None] + [3407 + i for i in range(1, SPEEDRUN_SEEDS)]
    assert "## Speedrun" in (tmp_path / "results.md").read_text()
    calls.clear()
    run_all.main([*args, "--fresh"])
    assert ("noise_scale", None, None) in calls  # --fresh: measured anew


def test_run_all_trains_the_speedruns_baseline_on_its_task_on_the_reference_profile(tmp_path, monkeypatch):
    """On the reference profile (a GPU's) run_all trains speed_0's seeds on the speedrun's task, apart from GPT-mini's.

    Its time to loss trains GPT-mini, so the seeds that set the speedrun's target run with --speedrun-task, their
    records in <out>/speedrun/, and the speedrun's stages race to the worst of their final losses."""
    calls = []

    def fake_run_stage(cmd, log, show, deadline=None):
        stage = Path(cmd[1]).stem
        seed = int(cmd[cmd.index("--seed") + 1]) if "--seed" in cmd else None
        calls.append(
            (stage, "--speedrun-task" in cmd, cmd[cmd.index("--target-loss") + 1] if "--target-loss" in cmd else None)
        )
        final = 2.0 + (0.1 * (seed - 3408) if seed else 0.0)
        record = _loss_record(stage, seed, [(0, 0, 4.0), (1000, 50, final)])
        write_record(Path(log).with_suffix(".json"), {**record, "profile": "reference"})
        return 0

    monkeypatch.setattr(run_all, "run_stage", fake_run_stage)
    monkeypatch.setattr(run_all, "run_noise_scale", lambda *a: None)
    monkeypatch.setattr(run_all.ngram_floor, "measure", lambda profile, target: {"target_loss": target})
    monkeypatch.setattr(run_all, "measure_cpu_peaks", lambda *a: None)
    monkeypatch.setattr(run_all, "remeasure_cpu_peak", lambda *a: None)
    monkeypatch.setattr(run_all, "prepare_data", lambda *a: None)
    args = ["--only", "speedrun", "--profile", "reference", "--device", "cpu", "--out", str(tmp_path)]
    run_all.main([*args, "--wandb", "disabled"])
    baseline = [c for c in calls if c[0] == "speed_0_baseline"]
    assert len(baseline) == 3 and all(on_task for _, on_task, _ in baseline)
    assert sorted(p.name for p in (tmp_path / "speedrun").glob("speed_0_baseline*.json")) == [
        "speed_0_baseline.json",
        "speed_0_baseline.seed3408.json",
        "speed_0_baseline.seed3409.json",
    ]
    assert not list(tmp_path.glob("time_to_loss/*.json"))
    assert {c[2] for c in calls[len(baseline) :]} == {repr(2.1)}  # the worst seed's final loss
    assert "2.1" in (tmp_path / "results.md").read_text().split("## Speedrun")[1]


def test_the_speedruns_wandb_runs_have_a_group_of_their_own(monkeypatch):
    from gpt.wandb_log import run_group

    monkeypatch.setenv("GPT_LADDER_GROUP", "cpu-cpu-1")
    assert run_group({"ladder": "speedrun", "profile": "cpu"}) == "cpu-cpu-1-speedrun"
    assert run_group({"ladder": "speed", "profile": "cpu"}) == "cpu-cpu-1"


def test_a_speedrun_stage_script_rejects_a_bad_learning_rate_in_one_line(tmp_path, capsys):
    """A speedrun stage's script rejects a bad --lr with exit 2 and one line, before any training.

    0 through the script as a user runs it (a fresh process: nothing else on stderr), nan through its entry point
    here."""
    script = STAGES_DIR / "speedrun_2_batch_lr.py"
    p = subprocess.run(
        [sys.executable, str(script), "--lr", "0", "--out", str(tmp_path), "--wandb", "disabled"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().count("\n") == 0 and "--lr" in p.stderr
    from gpt import stage

    with pytest.raises(SystemExit) as e:
        stage.stage_main(str(script), ["--lr", "nan", "--out", str(tmp_path), "--wandb", "disabled"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().count("\n") == 0 and "--lr" in err, err
    assert not list(tmp_path.rglob("*.json"))  # rejected before any training


def test_a_speedrun_stage_run_alone_races_to_speed_0s_model_in_its_folder_or_the_committed_one(
    tmp_path, monkeypatch, capsys
):
    """A speedrun stage run alone races to speed_0's model, from speed_0's records in its folder or the committed ones.

    Without --target-loss a speedrun stage takes the target run_all would give it: speed_0's seeds in its own folder
    first, else the committed records; with neither, --full-budget says it trains the whole budget."""
    from gpt import committed_records, stage

    committed, out = tmp_path / "committed", tmp_path / "out"
    monkeypatch.setattr(committed_records, "PUBLISHED", committed)
    assert stage.default_speedrun_target("speedrun_6_bigram", out, "cpu", "cpu", full_budget=True) is None
    assert "no target" in capsys.readouterr().out
    for folder, finals in ((committed / "cpu-cpu", [1.9, 1.8]), (out, [1.7, 1.75])):
        for seed, final in zip([None, 3408], finals):
            record = {"status": "ok", "metrics": {"val_loss_final": final}}
            write_record(record_path(time_to_loss_dir(folder), "speed_0_baseline", seed), record)
        target = stage.default_speedrun_target("speedrun_6_bigram", out, "cpu", "cpu")
        assert target == max(finals) and str(folder) in capsys.readouterr().out


def test_a_speedrun_stage_run_alone_on_a_gpu_races_to_the_committed_target(tmp_path, monkeypatch, capsys, char_data):
    """A speedrun stage run alone on a GPU races to the committed target, on the task it was set on.

    Simulated CUDA (device_type "cuda", so the reference profile) with an empty --out: the stage finds speed_0's
    model in the committed records of the task (records/cpu-cpu), says so in its first line, and trains the task's
    settings, not the reference profile's time-to-loss ones."""
    from gpt import stage

    committed = speedrun_target(published_dir(*SPEEDRUN_TARGET_SET_BY), SPEEDRUN_TARGET_SET_BY[0])
    assert committed == pytest.approx(1.8948, abs=1e-4)  # speed_0's worst seed on the task, as committed
    ran = []
    monkeypatch.setattr(stage, "device_type", lambda requested: "cuda")
    monkeypatch.setattr(stage, "_run_and_record", lambda *run: ran.append(run) or {"status": "ok"})
    monkeypatch.setattr(stage, "print_summary", lambda record, out: None)
    argv = ["--out", str(tmp_path), "--data-dir", str(char_data), "--wandb", "disabled"]
    assert stage._stage_main("speedrun_6_bigram", argv, "speedrun_6_bigram.py") == 0
    (cfg, meta, path, _), first = ran[0], capsys.readouterr().out.splitlines()[0]
    assert first.startswith("speedrun_6_bigram: target 1.8948") and str(published_dir("cpu", "cpu")) in first
    assert cfg.target_loss == committed and meta["profile"] == "reference"
    assert path == time_to_loss_dir(tmp_path, "speedrun") / "speedrun_6_bigram.json"
    on_cpu = stage_config("speedrun_6_bigram", "cpu", data_dir=str(char_data), target_loss=committed)
    assert _task_config(cfg) == _task_config(on_cpu)


def test_a_speedrun_stage_with_no_target_says_so_first_and_stops(tmp_path):
    """A speedrun stage with no target found says so in its first line and stops, before any training.

    smoke's task has no committed target; without --target-loss or --full-budget the stage is a one-line error."""
    p = subprocess.run(
        [sys.executable, str(STAGES_DIR / "speedrun_6_bigram.py"), "--profile", "smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and not p.stdout, p.stdout
    assert p.stderr.startswith("error: speedrun_6_bigram: no target") and p.stderr.strip().count("\n") == 0
    assert not list(tmp_path.rglob("*.json"))


def _task_config(cfg) -> dict:
    """A config's settings but the device it was asked for: what the task is."""
    return {k: v for k, v in cfg.to_dict().items() if k != "device"}


def _schedule_in_steps(cfg) -> dict:
    """A run's schedule in steps of its batch: budget, warm-up, decay, Muon's momentum warm-up, evaluations."""
    fields = ("train_tokens", "lr_warmup_tokens", "lr_decay_tokens", "muon_momentum_warmup_tokens", "eval_every_tokens")
    return {f.removesuffix("_tokens"): getattr(cfg, f) / cfg.tokens_per_step for f in fields}


TASK_RUNS = [("cpu", "cpu"), ("cpu", "cuda"), ("reference", "cpu"), ("reference", "cuda")]  # (profile, device)


@pytest.mark.parametrize("stage", ["speed_0_baseline", *SPEEDRUN])
def test_the_speedrun_is_one_task_on_every_profile_and_device(stage):
    """The speedrun is one task on every profile and device: the cpu profile's character model, data and budget.

    Each speedrun stage, and speed_0 where it sets the speedrun's target, has the same settings on cpu and reference,
    asked for cpu or cuda; so has its schedule in steps. Only smoke shrinks the task; reference's time to loss keeps
    GPT-mini."""
    configs = [stage_config(stage, profile, speedrun_task=True, device=device) for profile, device in TASK_RUNS]
    assert all(_task_config(cfg) == _task_config(configs[0]) for cfg in configs)
    assert all(_schedule_in_steps(cfg) == _schedule_in_steps(configs[0]) for cfg in configs)
    task = configs[0]
    depth = 1 if "speedrun_23_one_block" in lineage(stage) else 4  # nanoGPT's recipe's, then speedrun_23's one block
    assert (task.n_layer, task.n_embd, task.block_size, task.eval_windows, task.dropout) == (depth, 128, 64, 200, 0.0)
    assert stage_config("speed_0_baseline", "reference", to_a_loss=True).block_size == 128
    assert stage_config(stage, "smoke", speedrun_task=True).block_size == 32


@pytest.mark.parametrize("profile", ["cpu", "reference", "smoke"])
def test_speedrun_8s_momentum_warm_up_is_in_steps_of_its_batch(profile):
    """speedrun_8 warms Muon's momentum up over 25 steps of its batch on every profile: 76,800 tokens on the task."""
    cfg = stage_config("speedrun_8_muon_schedule", profile)
    assert _schedule_in_steps(cfg)["muon_momentum_warmup"] == 25
    assert profile == "smoke" or cfg.muon_momentum_warmup_tokens == 76_800


@pytest.mark.parametrize("profile", ["cpu", "reference"])
def test_speedrun_14_doubles_adamws_rate_and_changes_nothing_else(profile):
    """speedrun_14 doubles AdamW's peak and floor rates; the rest (Muon's rate too) is its parent's.

    The schedule reads min_lr / lr for each group's share (gpt/optimizations/schedule.py), so with both doubled
    Muon's groups follow the same curve as before; the CPU trace's wsd test checks that in a run."""
    import dataclasses

    parent = dataclasses.asdict(stage_config("speedrun_13_host_memory", profile))
    child = dataclasses.asdict(stage_config("speedrun_14_adamw_rate", profile))
    changed = {k for k in child if child[k] != parent[k]}
    assert changed == {"lr", "min_lr"}
    assert (child["lr"], child["min_lr"]) == (2 * parent["lr"], 2 * parent["min_lr"])
    assert child["lr"] == pytest.approx(8e-3) and child["muon_lr"] == parent["muon_lr"]


@pytest.mark.parametrize("profile", ["cpu", "reference"])
def test_speedrun_15_decays_over_80_percent_and_changes_nothing_else(profile):
    """speedrun_15 moves the wsd decay's start from 60% to 20% of the budget; every other setting is its parent's.

    The learning rate at each step, from the schedule itself: the same through the warm-up, lower from 20% of the
    budget on (its decay began), the same floor at the end."""
    import dataclasses

    from gpt.optimizations.schedule import learning_rate

    parent, child = (stage_config(s, profile) for s in ("speedrun_14_adamw_rate", "speedrun_15_longer_decay"))
    changed = {k for k, v in dataclasses.asdict(child).items() if v != getattr(parent, k)}
    assert changed == {"lr_cooldown"} and (parent.lr_cooldown, child.lr_cooldown) == (0.4, 0.8)
    budget, warmup = child.train_tokens, child.lr_warmup_tokens
    for tokens in range(0, budget + 1, child.tokens_per_step):
        before, after = learning_rate(parent, tokens), learning_rate(child, tokens)
        if tokens <= max(warmup, 0.2 * budget):
            assert after == pytest.approx(before), tokens
        elif tokens < 0.6 * budget:
            assert after < before == pytest.approx(parent.lr), tokens
        else:
            assert after <= before, tokens
    assert learning_rate(child, budget) == pytest.approx(learning_rate(parent, budget)) == pytest.approx(child.min_lr)


@pytest.mark.parametrize("profile", ["cpu", "reference"])
def test_speedrun_16_keeps_muons_momentum_at_085_every_step_and_changes_nothing_else(profile):
    """speedrun_16 sets Muon's momentum to 0.85; every other setting is its parent's.

    The momentum at each step, from the schedule itself: the parent's rises from 0.85 to 0.95 over its warm-up; the
    child's warm-up starts and ends at 0.85, so it is 0.85 at every step of the budget."""
    import dataclasses

    from gpt.optimizations.schedule import MUON_MOMENTUM_START, muon_momentum

    parent, child = (stage_config(s, profile) for s in ("speedrun_15_longer_decay", "speedrun_16_muon_momentum"))
    changed = {k for k, v in dataclasses.asdict(child).items() if v != getattr(parent, k)}
    assert changed == {"muon_momentum"} and (parent.muon_momentum, child.muon_momentum) == (0.95, 0.85)
    steps = range(0, child.train_tokens + 1, child.tokens_per_step)
    assert [muon_momentum(child, tokens) for tokens in steps] == pytest.approx([MUON_MOMENTUM_START] * len(steps))
    rising = [muon_momentum(parent, tokens) for tokens in steps]
    assert rising[0] == pytest.approx(0.85) and rising[-1] == pytest.approx(0.95) and rising == sorted(rising)


@pytest.mark.parametrize("profile", ["cpu", "reference"])
def test_speedrun_17_adds_the_four_gram_table_and_changes_nothing_else(profile):
    """speedrun_17 switches the hashed four-gram table on; every other setting and table is its parent's."""
    import dataclasses

    from gpt.optimizations.ngram_embedding import FOURGRAM_ROWS

    parent, child = (stage_config(s, profile) for s in ("speedrun_16_muon_momentum", "speedrun_17_fourgram"))
    changed = {k for k, v in dataclasses.asdict(child).items() if v != getattr(parent, k)}
    assert changed == {"fourgram_embedding"}
    before, after = (optimizations.model_settings(c, "cpu", 65) for c in (parent, child))
    assert after == {**before, "fourgram_rows": FOURGRAM_ROWS}


@pytest.mark.parametrize("profile", ["cpu", "reference", "smoke"])
def test_speedrun_23_keeps_one_block_of_its_parents_model_and_changes_nothing_else(profile):
    """speedrun_23 sets the depth to one block on every profile and nothing else.

    The model is its parent's with the blocks after the first removed (every other parameter's name and shape kept),
    and Muon gets one block's matrices."""
    import dataclasses

    from gpt.model import GPT, GPTConfig
    from gpt.optimizations.muon import hidden_matrices

    parent, child = (stage_config(s, profile) for s in ("speedrun_22_eval_near_target", "speedrun_23_one_block"))
    changed = {k for k, v in dataclasses.asdict(child).items() if v != getattr(parent, k)}
    assert changed == {"n_layer"} and child.n_layer == 1 < parent.n_layer
    assert model_settings(child, "cpu", 65) == model_settings(parent, "cpu", 65)

    def model(cfg):
        shape = dict(vocab_size=65, block_size=cfg.block_size, dropout=cfg.dropout, **cfg.model_shape)
        return GPT(GPTConfig(**shape, **model_settings(cfg, "cpu", 65)))

    before, after = model(parent), model(child)
    shapes = {name: p.shape for name, p in after.named_parameters()}
    kept = {
        name: p.shape if name not in ("resid_scales", "x0_scales") else torch.Size([1])
        for name, p in before.named_parameters()
        if not name.startswith("transformer.h.") or name.startswith("transformer.h.0.")
    }
    assert shapes == kept
    assert len(hidden_matrices(after)) * parent.n_layer == len(hidden_matrices(before))


@pytest.mark.parametrize("profile", ["cpu", "reference"])
@pytest.mark.parametrize(
    "parent, stage, flag",
    [
        ("speedrun_17_fourgram", "speedrun_18_batched_muon", "muon_batched"),
        ("speedrun_18_batched_muon", "speedrun_19_gc_freeze", "gc_freeze"),
        ("speedrun_20_untied_head", "speedrun_21_plain_optimizer", "plain_optimizer"),
        ("speedrun_21_plain_optimizer", "speedrun_22_eval_near_target", "eval_near_target_only"),
    ],
)
def test_a_systems_stage_after_17_switches_one_flag_on_and_changes_nothing_else(profile, parent, stage, flag):
    """speedrun_18 (Muon batched) and speedrun_19 (gc.freeze) each switch one flag on; all else, the model too, kept."""
    import dataclasses

    before, child = stage_config(parent, profile), stage_config(stage, profile)
    changed = {k for k, v in dataclasses.asdict(child).items() if v != getattr(before, k)}
    assert changed == {flag} and getattr(child, flag) is True
    assert optimizations.model_settings(child, "cpu", 65) == optimizations.model_settings(before, "cpu", 65)


@pytest.fixture
def torch_211_image(monkeypatch):
    """What a CUDA image with torch 2.11 and no optional kernel library offers.

    No F.linear_cross_entropy, neither liger-kernel nor Cut Cross-Entropy importable."""
    import importlib.util

    import torch

    monkeypatch.delattr(torch.nn.functional, "linear_cross_entropy", raising=False)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in chunked_loss.MODULES.values() else real_find_spec(name, *a),
    )


@pytest.mark.parametrize("stage", SPEEDRUN)
def test_every_speedrun_stage_runs_on_a_cuda_image_without_a_chunked_loss_library(stage, torch_211_image, monkeypatch):
    """Every speedrun stage runs on a CUDA image with torch 2.11 and no library, computing the full loss by rule.

    The speedrun is judged by time: its character vocabulary is no wider than the model, so its stages compute the
    full loss (chunked_loss.narrow_vocabulary_rule) and say so in the record's choices, instead of being skipped
    whole, as they were on torch 2.11 before the full loss stood in."""
    cfg = stage_config(stage, "reference")
    assert cfg.loss == "chunked"  # speedrun_1 asks for it; the rule is the vocabulary's, not the config's
    assert why_cannot_run(cfg, "cuda") is None
    loss, why = chunked_loss.loss_used(cfg, "cuda", 80)
    assert loss == "full" and why.startswith("kept the full loss by rule: ")
    from gpt.optimizations import fused_attention

    monkeypatch.setattr(fused_attention, "measured_attention_choice", lambda cfg, device_type: ("sdpa", None))
    assert model_settings(cfg, "cuda", 80)["loss"] == "full"


def test_a_run_for_memory_computes_the_plain_chunked_loss_and_a_named_library_still_needs_installing(torch_211_image):
    """On torch 2.11 without a library, lean_2 computes the chunked loss with plain PyTorch; a named library is needed.

    lean_2's point is the logits it never holds: "plain" holds one chunk of them on any torch. An implementation
    asked for by name is the user's choice: without it the stage is skipped with the reason."""
    lean_2 = stage_config("lean_2_chunked_loss", "reference")
    assert chunked_loss.why_unavailable(lean_2.loss_impl, "cuda") is None  # it needs 2 GPUs still (its FSDP)
    assert chunked_loss.resolve(lean_2.loss_impl, "cuda") == "plain"
    named = stage_config("speedrun_1_systems", "reference", loss_impl="liger")
    assert why_cannot_run(named, "cuda") == "the chunked loss 'liger' needs `pip install liger-kernel`"


def test_the_record_says_which_loss_and_attention_ran_and_why(monkeypatch):
    """The record says which loss and attention ran, and why.

    The record's choices name the loss and the attention the model computed with, and why they are not the config's:
    here speedrun_1's chunked loss, measured slower than the full one at its shape (the measurement stubbed)."""
    from gpt.model import GPTConfig
    from gpt.run_choices import model_choices

    why = "kept the full loss: the chunked loss (plain) is slower on this CPU at this shape"
    monkeypatch.setattr(chunked_loss, "measured_loss_choice", lambda cfg, vocab_size, device_type: ("full", why))
    cfg = stage_config("speedrun_1_systems", "smoke", attention="naive")
    got = model_choices(cfg, torch.device("cpu"), GPTConfig(vocab_size=65, loss="full", attention="naive"))
    assert got["loss"] == "full" and got["loss_why"] == why
    assert got["attention"] == "naive" and got["attention_why"] is None


# ---- the last stage as the ladder trains it: on the CPU here, on CUDA in tests/test_gpu.py -----------------------

SPEEDRUN_STEPS = 40  # of speedrun_5's batch (16 on the smoke profile): warm-up to step 2, the peak to 24, decay to 40


@dataclass
class StageTrace:
    """A watched run to a loss of the speedrun's last stage.

    Its config and record; at each evaluation, the steps done, the CUDA graphs recorded and the graphs Dynamo compiled
    so far in this process; each step's learning rates, one per param group, as AdamW's and Muon's step() began."""

    cfg: TrainConfig
    record: dict
    evaluations: list[tuple[int, int, int]]
    adamw_lrs: list[list[float]]
    muon_lrs: list[list[float]]


def trace_last_stage(char_data, device: str) -> StageTrace:
    """speedrun_5_wsd trained to a loss on `device` for SPEEDRUN_STEPS steps at the smoke profile's shapes.

    All its ladder switches on (compile, with CUDA graphs on CUDA; autocast; gathered batches; Muon; the modern blocks;
    wsd), evaluated after every step: on CUDA each evaluation comes between two replays of the step's graphs. Where the
    device has no chunked loss (torch 2.11 on CUDA without liger-kernel or Cut Cross-Entropy) the stage computes the
    full loss (chunked_loss.loss_used)."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    stage = SPEEDRUN[-1]
    cfg = learning_budget(stage, char_data, device, steps=SPEEDRUN_STEPS)
    cfg.eval_every_tokens = cfg.tokens_per_step  # an evaluation after every step
    # the compiled path, which a GPU takes: on a CPU a run this short stays eager (tests/optimizations/
    # test_compilation.py checks that rule), and the trace would then have no graphs to watch
    cfg.compile_if_it_pays = False
    optimizations.validate(cfg)
    recorded, evaluations, adamw_lrs, muon_lrs = [0], [], [], []
    real_record, real_prepare = CUDAGraphTreeManager.record_function, train.prepare
    real_evaluate = time_to_loss.validation_loss_of

    def record_function(manager, *args, **kwargs):  # every recording, the first of a graph and any re-recording
        recorded[0] += 1
        return real_record(manager, *args, **kwargs)

    def prepare(*args, **kwargs):
        trainer = real_prepare(*args, **kwargs)
        for optimizer, lrs in ((trainer.optimizer.adamw, adamw_lrs), (trainer.optimizer.muon, muon_lrs)):
            optimizer.register_step_pre_hook(lambda o, *_, lrs=lrs: lrs.append([g["lr"] for g in o.param_groups]))
        return trainer

    def evaluate(trainer, val):
        evaluations.append((trainer.steps_done, recorded[0], counters["stats"]["unique_graphs"]))
        return real_evaluate(trainer, val)

    # compiled afresh, as in the stage's own process: the compilations of GPT.forward by earlier tests in this process
    # would count towards Dynamo's recompile limit, past which it runs the model eager
    torch._dynamo.reset()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CUDAGraphTreeManager, "record_function", record_function)
        patch.setattr(train, "prepare", prepare)
        patch.setattr(time_to_loss, "validation_loss_of", evaluate)
        record = time_to_loss.run(cfg, label=stage)
    return StageTrace(cfg, record, evaluations, adamw_lrs, muon_lrs)


def check_the_last_stage_learns_compiled(trace: StageTrace) -> None:
    """The stage trained compiled, without recompiling at evaluations, and learnt.

    Dynamo compiled its graphs at the first step, and none after: evaluations do not make it recompile; in
    "reduce-overhead" mode with bf16 autocast on CUDA. The validation loss fell from ~ln 65 = 4.17 by a fifth or more
    (to 2.93 on this CPU, bf16), the training loss too. On CUDA its graphs were recorded once: over the second half of
    the run, every step of which follows an evaluation, the count of recordings stays what it was (an evaluation that
    broke the graphs would add a re-recording at every step), and is not 0."""
    cfg, m = trace.cfg, trace.record["metrics"]
    device = resolve_device(cfg.device)
    cuda_graphs = uses_cuda_graphs(compile_mode(cfg, device))
    choices = trace.record["choices"]
    assert choices["compile_mode"] == ("reduce-overhead" if cuda_graphs else "default")
    if device.type == "cuda":
        assert choices["amp_dtype"] == "bfloat16" and not choices["grad_scaler"]
    assert m["steps"] == SPEEDRUN_STEPS and [p["step"] for p in m["curve"]] == list(range(SPEEDRUN_STEPS + 1))
    assert m["val_loss_final"] < 0.8 * m["val_loss_initial"], m["curve"]
    assert m["curve"][-1]["train_loss"] < m["curve"][1]["train_loss"]
    steps, recorded, compiled = zip(*trace.evaluations)
    assert steps == tuple(range(SPEEDRUN_STEPS + 1))
    assert compiled[1] > compiled[0], "no graph compiled at the first step: the model ran eager"
    assert set(compiled[1:]) == {compiled[1]}, f"compiled again after the first step: {compiled}"
    if cuda_graphs:
        settled = recorded[SPEEDRUN_STEPS // 2 :]
        assert settled[0] > 0, "no CUDA graph recorded: the step ran without its graphs"
        assert set(settled) == {settled[0]}, f"CUDA graphs recorded again between evaluations: {recorded}"
    else:
        assert set(recorded) == {0}


def check_the_groups_follow_wsd(trace: StageTrace) -> None:
    """As each step ran, every param group's learning rate followed wsd.

    Every AdamW group's learning rate was wsd's at the tokens that step brings training to, and every Muon group's the
    same share of muon_lr. wsd is written out here from its definition (the docstring of gpt/optimizations/schedule.py),
    not from its code; the run's steps cover its three phases: warm-up (rising), stable (the peak), decay (falling
    linearly to min_lr at the budget's end)."""
    cfg = trace.cfg
    decay_from = (1 - cfg.lr_cooldown) * cfg.lr_decay_tokens

    def share(tokens: int) -> float:
        if tokens < cfg.lr_warmup_tokens:
            return tokens / cfg.lr_warmup_tokens
        if tokens < decay_from:
            return 1.0
        done = min(1.0, (tokens - decay_from) / (cfg.lr_decay_tokens - decay_from))
        return 1.0 - done * (1.0 - cfg.min_lr / cfg.lr)

    def muon_share(tokens: int) -> float:  # muon_lr_warmup False (speedrun_8): Muon's groups start at the peak
        return share(tokens) if cfg.muon_lr_warmup or tokens >= cfg.lr_warmup_tokens else 1.0

    shares = [share(step * cfg.tokens_per_step) for step in range(1, SPEEDRUN_STEPS + 1)]
    assert len(trace.adamw_lrs) == len(trace.muon_lrs) == SPEEDRUN_STEPS
    for step, (s, adamw, muon) in enumerate(zip(shares, trace.adamw_lrs, trace.muon_lrs), 1):
        assert adamw == pytest.approx([s * cfg.lr] * len(adamw), rel=1e-9), step
        m = muon_share(step * cfg.tokens_per_step)
        assert muon == pytest.approx([m * cfg.muon_lr] * len(muon), rel=1e-9), step
    stable = [i for i, s in enumerate(shares) if s == 1.0]
    assert 0 < stable[0] and stable[-1] < SPEEDRUN_STEPS - 2 and stable == list(range(stable[0], stable[-1] + 1))
    assert shares[: stable[0]] == sorted(shares[: stable[0]]) and shares[0] < 1  # the warm-up rises
    decay = shares[stable[-1] + 1 :]
    assert decay == sorted(decay, reverse=True) and decay[-1] == pytest.approx(cfg.min_lr / cfg.lr)


@pytest.fixture(scope="module")
def cpu_trace(char_data) -> StageTrace:
    return trace_last_stage(char_data, "cpu")


@pytest.mark.slow
def test_the_last_stage_learns_compiled_on_the_cpu(cpu_trace):
    """The CPU twin of tests/test_gpu.py's run on CUDA: the same run, compiled without CUDA graphs.

    Slow: it compiles (~45 s on 2 cores)."""
    check_the_last_stage_learns_compiled(cpu_trace)


@pytest.mark.slow
def test_the_last_stages_optimizer_groups_follow_wsd_on_the_cpu(cpu_trace):
    check_the_groups_follow_wsd(cpu_trace)


@pytest.mark.parametrize("folder", ["cpu-cpu", "cpu-epyc-avx2-2026-11-28"])  # an AVX512-BF16 EPYC's run, an AVX2 one's
def test_the_last_stage_is_read_against_its_floors_from_its_records(tmp_path, folder):
    """The section's floors line: tokens against the n-gram count, throughput against the fastest measured peak.

    Each figure recomputed here from the committed records; without the n-gram record (a run older than it) or for
    another target, the line leaves the count out rather than compare with a floor of another task. The peak is the
    fastest of the precisions measured at the stage's 2 threads: bf16's on a CPU with bf16 units, fp32's on one that
    emulates bf16 (where bf16's is a hundredth of fp32's)."""
    import json
    import shutil
    import statistics

    from gpt.report.speedrun import floors_finding

    runs = tmp_path / "runs"
    shutil.copytree(REPO / "records" / folder, runs)
    line = floors_finding(Speedrun(runs))
    last = re.match(r"`(\w+)` against its floors", line)[1]
    records = [json.loads(p.read_text()) for p in sorted((runs / "speedrun").glob(f"{last}*.json"))]
    machine = json.loads((runs / "machine.json").read_text())
    floor = json.loads((runs / "speedrun" / "ngram_floor.json").read_text())
    rate = statistics.fmean(r["metrics"]["tokens_per_s"] for r in records)
    peak = max(v for k, v in machine["cpu_peaks_gflops"].items() if k.endswith(" x2 threads"))
    share = rate * records[0]["model"]["flops_per_token"] / 1e9 / peak
    assert f"{rate:,.0f} (" in line and f"{share:.0%} of the {fmt_num(peak)} GFLOP/s" in line
    assert f"and {floor['reached_at']:,} training characters" in line
    (runs / "speedrun" / "ngram_floor.json").unlink()
    assert "5-gram" not in floors_finding(Speedrun(runs)) and f"{rate:,.0f} (" in floors_finding(Speedrun(runs))

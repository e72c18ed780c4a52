"""The first run of the README's try (gpt/first_run.py) and the README's sentence made from its record.

And what the timing tools (it and gpt/suite_time.py) do with options."""

import json

import pytest

from gpt import first_run, suite_time
from gpt.ladder import stages_of
from gpt.records import write_record
from gpt.report import readme


def test_the_try_is_the_last_speedrun_stage_into_tmp_try_without_wandb():
    last = stages_of("speedrun")[-1]
    assert first_run.try_command(last) == [
        ".venv/bin/python",
        f"stages/{last}.py",
        "--out",
        "/tmp/try",
        "--wandb",
        "disabled",
    ]
    assert readme.try_command() == f"\n```bash\n{' '.join(first_run.try_command(last))}\n```\n"


@pytest.fixture
def committed_run(tmp_path):
    """A committed run whose speed_0 took 120 and 130 s, launch to exit, on an "EPYC with AVX512-BF16"."""
    runs = tmp_path / "runs"
    write_record(runs / "machine.json", {"cpu": "EPYC with AVX512-BF16"})
    for seed, wall in ((3407, 120.0), (3408, 130.0)):
        name = "speed_0_baseline" + ("" if seed == 3407 else f".seed{seed}")
        record = {"stage": "speed_0_baseline", "status": "ok", "config": {"seed": seed}, "run": {"wall_s": wall}}
        metrics = {"train_seconds": 100.0, "val_loss_final": 1.9}
        write_record(runs / "time_to_loss" / f"{name}.json", {**record, "metrics": metrics})
    return runs


def test_the_readme_gives_the_newest_first_run_its_ratio_on_the_same_cpu_and_the_one_before_on_its_generation(
    tmp_path, monkeypatch, committed_run
):
    """The ratio to speed_0's whole process where both ran on one kind of CPU; the run before, on one generation.

    A Zen 5 and a Zen 4 EPYC are both "with AVX512-BF16": only a generation named on both makes them comparable.

    Seen failing on the rule it replaced, the entry before whatever its CPU: the Zen 5's 6.4 s came beside the Zen 4's
    12.4 s under one name. A run before it of the same commit and stage is called that (seen failing when it was
    "before it", which read as older code)."""
    last, zen4, zen5 = stages_of("speedrun")[-1], "(family 25, model 17)", "(family 26, model 2)"
    entry = {"commit": "abc1234", "cores": 2, "split": {"import_setup_s": 2.0, "train_seconds": 5.0}}
    runs = [
        {
            **entry,
            "commit": "0123abc",
            "stage": "speedrun_1_systems",
            "cpu": f"EPYC with AVX512-BF16 {zen4}",
            "wall_s": 30.0,
        },
        {**entry, "stage": "speedrun_2_batch", "cpu": "EPYC with AVX512-BF16", "wall_s": 20.0},
        {**entry, "stage": "speedrun_3", "cpu": f"EPYC with AVX512-BF16 {zen5}", "wall_s": 9.0},
        {**entry, "stage": last, "cpu": f"EPYC with AVX512-BF16 {zen4}", "wall_s": 12.5},
    ]
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(first_run, "RECORD", tmp_path / "first_run.json")
    assert readme.try_first_run(committed_run) == (
        "A first run of it with empty caches took 12.5 s, launch to exit (imports and arguments 2.0, training 5.0), "
        f"at commit abc1234 on a 2-core EPYC with AVX512-BF16 {zen4}: 10.0x sooner than `speed_0_baseline`'s whole "
        "process in the committed run (125 s, the mean of its 2 seeds); before it `speedrun_1_systems` took 30.0 s at "
        f"commit 0123abc on a 2-core EPYC with AVX512-BF16 {zen4}"
    )
    runs.insert(3, {**runs[3], "wall_s": 18.0})  # one before of the same commit and stage: the machine's spread
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    assert readme.try_first_run(committed_run).endswith(
        f"; another first run of it at that commit on a 2-core EPYC with AVX512-BF16 {zen4} took 18.0 s (the same "
        "code: the two differ by the machine's state alone)"
    )
    del runs[3]
    runs[0]["cpu"] = "EPYC with AVX512-BF16"  # no run before it of a known generation: none is named
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    assert "before it" not in readme.try_first_run(committed_run)
    runs[-1] = {**runs[-1], "cpu": "Xeon with AMX", "stage": "speedrun_1_systems"}
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    text = readme.try_first_run(committed_run)
    assert "sooner" not in text and text.startswith("A first run of `speedrun_1_systems`, the last stage then, with")


@pytest.mark.parametrize("tool, words", [(first_run, "first run"), (suite_time, "fresh clone")])
@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--seed", "1"], 2)])
def test_the_timing_tools_take_no_options_and_time_nothing_when_given_one(tool, words, monkeypatch, capsys, argv, code):
    """`--help` says what it times and anything else is refused, before anything runs or the record is touched.

    Seen failing before each parsed its arguments: `--help` ran the stage for 15 s (first_run), or cloned and timed the
    whole suite for 6 min (suite_time), and appended an entry."""
    monkeypatch.setattr(tool, "measure", lambda what: pytest.fail("it timed something"))
    monkeypatch.setattr(tool, "append_run", lambda *a: pytest.fail("the record was written"))
    with pytest.raises(SystemExit) as ended:
        tool.main(argv)
    assert ended.value.code == code
    assert code != 0 or words in capsys.readouterr().out

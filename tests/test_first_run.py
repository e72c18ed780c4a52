"""The first run of the README's try (gpt/first_run.py) and the README's sentence made from its record.

And what the timing tools (it and gpt/suite_time.py) do with options."""

import json
import subprocess
import sys

import pytest
from conftest import REPO, smoke_stage_argv

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


def test_the_readme_gives_the_first_runs_of_the_newests_code_or_the_newest_and_the_one_before_on_its_generation(
    tmp_path, monkeypatch, committed_run
):
    """The ratio to speed_0's whole process where both ran on one kind of CPU; the run before, on one generation.

    A Zen 5 and a Zen 4 EPYC are both "with AVX512-BF16": only a generation named on both makes them comparable.

    Seen failing on the rule it replaced, the entry before whatever its CPU: the Zen 5's 6.4 s came beside the Zen 4's
    12.4 s under one name. Runs of the newest's code (gpt/first_run.py:code_of) come as their median and range, the
    newest being one draw of the machine's state (seen failing on the rule it replaced, which named the newest and the
    one before it of its commit: 7.7 and 8.1 s where 4 runs of the code took 7.7-13.7 s)."""
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
    # runs of the newest's code on its CPU kind and cores: their median and range, whatever their commits
    code = "1111111"
    runs[3]["code"] = code
    runs[3:3] = [
        {**runs[3], "commit": "9999999", "wall_s": 18.0},
        {**runs[3], "wall_s": 11.0, "code": "4444444"},  # other code: not among them
        {**runs[3], "wall_s": 10.0, "cores": 4},  # other cores: not among them
    ]
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    assert readme.try_first_run(committed_run) == (
        "2 first runs of it with empty caches, all of one code (what a stage runs, the same at commits 9999999 and "
        f"abc1234), on a 2-core EPYC with AVX512-BF16 {zen4}, took 12.5-18.0 s launch to exit, median 15.2 s: "
        "8.2x (6.9-10.0x) sooner than `speed_0_baseline`'s whole process in the committed run (125 s, the mean of its "
        "2 seeds); they differ by the machine's state alone. The newest took 12.5 s (imports and arguments 2.0, "
        "training 5.0), at commit abc1234"
    )
    del runs[3:6]
    del runs[-1]["code"]
    runs[0]["cpu"] = "EPYC with AVX512-BF16"  # no run before it of a known generation: none is named
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    assert "before it" not in readme.try_first_run(committed_run)
    runs[-1] = {**runs[-1], "cpu": "Xeon with AMX", "stage": "speedrun_1_systems"}
    (tmp_path / "first_run.json").write_text(json.dumps({"runs": runs}))
    # the newest on the committed run's kind of CPU, with its ratio, then the newer one on another kind: seen failing
    # on the rule it replaced, the newest whatever its CPU (an AVX2 EPYC's 8.6 s took the Zen 4's 28.4x away)
    text = readme.try_first_run(committed_run)
    assert text.startswith("A first run of `speedrun_3`, the last stage then, with empty caches took 9.0 s") and (
        "at commit abc1234 on a 2-core EPYC with AVX512-BF16 (family 26, model 2): 13.9x sooner than" in text
    )
    assert text.endswith(
        ". The newest first run, of `speedrun_1_systems` at commit abc1234, ran on another kind of CPU, a 2-core Xeon "
        "with AMX: 12.5 s launch to exit"
    )
    write_record(committed_run / "machine.json", {"cpu": "Xeon with AMX"})  # its own kind: no other named
    text = readme.try_first_run(committed_run)
    assert text.startswith("A first run of `speedrun_1_systems`, the last stage then, with") and "another" not in text
    write_record(committed_run / "machine.json", {"cpu": "Graviton"})  # none on its kind: the newest, with no ratio
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


def test_the_code_of_a_first_run_is_what_a_stage_runs_and_none_with_changes_to_it(tmp_path, monkeypatch):
    """Commits apart by docs, tests or the report have one code; one changing the rest of gpt/ another; changes: none.

    Seen failing on a version that hashed the commit's whole tree: the docs commit gave another code."""

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout

    def commit(message):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", message)

    for path in ("gpt/model.py", "gpt/report/results.py", "stages/s.py", "pyproject.toml", "docs/a.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("1\n")
    git("init", "-q")
    git("add", ".")
    commit("code")
    monkeypatch.setattr(first_run, "REPO_ROOT", tmp_path)
    code = first_run.code_of()
    assert code == first_run.code_of(git("rev-parse", "HEAD").strip())
    for path in ("docs/a.md", "gpt/report/results.py"):  # changes outside the code a stage runs
        (tmp_path / path).write_text("2\n")
        assert first_run.code_of() == code
        commit(path)
        assert first_run.code_of() == code
    (tmp_path / "gpt/model.py").write_text("2\n")
    assert first_run.code_of() is None
    commit("model")
    assert first_run.code_of() not in (None, code)


def modules_of_a_stage_process(stage: str, char_data, tmp_path) -> list[str]:
    """The modules a stage's script has loaded when its process exits, run as the try runs it (smoke, a few steps)."""
    script = REPO / "stages" / f"{stage}.py"
    probe = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('MODULES', *sorted(sys.modules)))\n"
        f"sys.argv = [{str(script)!r}, *sys.argv[1:]]\n"
        f"runpy.run_path({str(script)!r}, run_name='__main__')\n"
    )
    argv = [*smoke_stage_argv(char_data, tmp_path), "--target-loss", "0.1", "--train-tokens", "4096"]  # a few steps
    r = subprocess.run([sys.executable, "-c", probe, *argv], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.split("MODULES", 1)[1].split()


def test_a_stage_process_imports_none_of_what_a_first_runs_code_leaves_out(tmp_path, char_data):
    """The last speedrun stage's script, run as the try runs it (smoke profile), loads no module of NOT_RUN.

    Seen failing with gpt/evaluation.py added to NOT_RUN."""
    modules = [
        m for m in modules_of_a_stage_process(stages_of("speedrun")[-1], char_data, tmp_path) if m.startswith("gpt")
    ]
    assert "gpt.stage" in modules and "gpt.train" in modules
    files = {m.replace(".", "/") + suffix for m in modules for suffix in (".py", "/")}
    assert not {f for f in files if f.startswith(first_run.NOT_RUN)}, first_run.NOT_RUN


def test_a_first_runs_entry_keeps_the_precision_its_stage_measured_and_why(monkeypatch):
    """measure() copies the stage record's compute dtype and its reason into the entry, beside the wall clock.

    A first run measures the bf16 rule afresh (its caches are empty), so two first runs of one code may train at two
    precisions: the entry must say which. The stage's process is stood in for by one that writes its record."""
    from types import SimpleNamespace

    from gpt.records import time_to_loss_dir

    stage = stages_of("speedrun")[-1]
    why = "measured matmul rates on this CPU: bf16 90.0, fp32 180.0 GFLOP/s (1024 x 1024, in turns)"

    real_run = subprocess.run

    def stage_process(cmd, **kwargs):
        if "--out" not in cmd:  # git, through subprocess.check_output
            return real_run(cmd, **kwargs)
        out = cmd[cmd.index("--out") + 1]
        choices = {"compute_dtype": "float32", "amp_why": why}
        record = {"metrics": {"train_seconds": 1.25, "target": {"tokens": 64000}}, "choices": choices}
        write_record(time_to_loss_dir(out, first_run.LADDER) / f"{stage}.json", record)
        return SimpleNamespace(returncode=0)

    monkeypatch.setattr(first_run.subprocess, "run", stage_process)
    entry = first_run.measure(stage)
    assert (entry["precision"], entry["precision_why"]) == ("float32", why)
    assert entry["split"] == {"train_seconds": 1.2} and entry["tokens_to_target"] == 64000

"""The quick run's own parts (gpt/quick_run.py): its plan and dry run, its GPU tests' cap, its limit, the compile cache.

The run itself is tested with stub stages in tests/test_report.py."""

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpt import quick_run, run_all
from gpt.records import read_record, write_record

REPO = Path(__file__).resolve().parents[1]


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan may wait a while for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_the_gpu_tests_closing_line_is_recorded_and_a_cut_run_says_so(tmp_path, monkeypatch):
    closing = "========== 30 passed, 6 skipped, 52 warnings in 101.97s (0:01:41) =========="
    monkeypatch.setattr(
        quick_run, "gpu_tests_command", lambda: [sys.executable, "-c", f"print('....s'); print({closing!r})"]
    )
    result = quick_run.run_gpu_tests(tmp_path, quick_run.Deadline.starting_now(4.0))
    assert result["summary"] == "30 passed, 6 skipped, 52 warnings in 101.97s (0:01:41)" and result["exit_code"] == 0
    assert read_record(tmp_path / "gpu_tests.json") == result

    monkeypatch.setattr(quick_run, "GPU_TESTS_CAP_S", 1.0)
    script = "import time; print('tests/test_gpu.py ....', flush=True); time.sleep(60)"
    monkeypatch.setattr(quick_run, "gpu_tests_command", lambda: [sys.executable, "-c", script])
    result = quick_run.run_gpu_tests(tmp_path, quick_run.Deadline.starting_now(4.0))
    assert result["exit_code"] is None and result["summary"].startswith("stopped at 1 s; last line: ")


def test_a_process_the_tests_start_takes_ctrl_c_however_the_suite_was_launched():
    """A process a test starts takes SIGINT as Ctrl-C, even when the suite was launched with it ignored (conftest.py).

    Seen failing with the suite launched as a background job (`(trap '' INT; pytest ...)`) before conftest took the
    handler back: the child ignored SIGINT, and each stop below waited out stop_tree's 15-s grace (16-17 s a test)."""
    script = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert r.stdout.strip() == "True"


def test_the_gpu_tests_stop_at_their_cap_with_every_process_they_started(tmp_path, monkeypatch):
    """At their cap the GPU tests stop as a process group: a stage process a test started is not left running."""
    pid_file = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    monkeypatch.setattr(quick_run, "gpu_tests_command", lambda: [sys.executable, "-c", script])
    monkeypatch.setattr(quick_run, "GPU_TESTS_CAP_S", 2.0)
    t0 = time.monotonic()
    result = quick_run.run_gpu_tests(tmp_path, quick_run.Deadline.starting_now(4.0))
    assert result["exit_code"] is None and time.monotonic() - t0 < 30
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # its parent gone, init reaps it
        if not running(grandchild):
            break
        time.sleep(0.1)
    else:
        os.kill(grandchild, 9)
        pytest.fail("the GPU tests' grandchild outlived their cap")


def dry_run(capsys, *options: str) -> list[str]:
    """The lines `./run_all.sh --quick --dry-run <options>` prints."""
    assert run_all.main(["--quick", "--dry-run", *options]) == 0
    return capsys.readouterr().out.splitlines()


def seconds(text: str) -> int:
    """'6 min 5 s' or '52 s' in seconds."""
    m = re.fullmatch(r"(?:(\d+) min )?(\d+) s", text.strip())
    return 60 * int(m[1] or 0) + int(m[2])


@pytest.mark.parametrize("kind", quick_run.GPU_KINDS)
def test_the_plan_of_a_gpu_fits_7_minutes_in_order_and_names_the_command_of_what_it_leaves_out(kind, tmp_path, capsys):
    """On an H100 or an H200, from their committed records: the GPU tests, the speedrun, the speed and fast ladders.

    In that order, each item with its seconds, the total last and within 7 minutes less the report's share; what does
    not fit is left out from the end, a section at a time, each with the command that runs it."""
    lines = dry_run(capsys, "--gpu", kind, "--out", str(tmp_path / "q"))
    assert lines[0].startswith("== quick run: a first look within 7 min 0 s") and kind in lines[1]
    items = [re.match(r"\s+(\d+ min \d+ s|\d+ s)  ([\w ]+): (\S+)", line) for line in lines[2:]]
    items = [m for m in items if m]
    assert items[0][2] == "gpu tests" and seconds(items[0][1]) <= quick_run.GPU_TESTS_CAP_S
    left_out = [line.split(": ", 1)[1] for line in lines if line.startswith("   not run")]
    order = [m[2] for m in items] + [section.split(",")[0] for section in left_out]
    assert list(dict.fromkeys(order)) == ["gpu tests", "speedrun", "speed", "fast"]
    for section in left_out:
        name = section.split(",")[0]
        assert section.endswith(f": ./run_all.sh --quick --only {name} --out {tmp_path / 'q'} --resume")
    total = seconds(lines[-1].removeprefix("total: "))
    assert lines[-1].startswith("total: ") and total == pytest.approx(sum(seconds(m[1]) for m in items), abs=len(items))
    assert total <= 7 * 60 * (1 - quick_run.REPORT_RESERVE)


def planned(capsys, kind: str, out: Path) -> dict[tuple[str, str], tuple[int, str]]:
    """A GPU's plan with room for everything: (section, name) -> (its seconds, the rule they come from)."""
    lines = dry_run(capsys, "--gpu", kind, "--time-limit", "60", "--out", str(out))
    items = [re.fullmatch(r"\s+(\d+ min \d+ s|\d+ s)  ([\w ]+): (\S+).*?  \((.*)\)", line) for line in lines[2:-1]]
    return {(m[2], m[3]): (seconds(m[1]), m[4]) for m in items}


def test_the_gpu_tests_are_planned_at_their_cap_where_no_folder_of_the_kind_ran_them(tmp_path):
    """Without a gpu_tests.json in this kind's folders the plan counts the GPU tests' cap; with one, its seconds."""
    figures = quick_run.Figures(own=tmp_path, committed=[tmp_path], profile="reference", device="cuda")
    assert figures.gpu_tests() == (quick_run.GPU_TESTS_CAP_S, "their cap")
    write_record(tmp_path / quick_run.GPU_TESTS_FILE, {"seconds": 12.5})
    assert figures.gpu_tests() == (12.5, f"{tmp_path.name}'s run of them")


def test_a_gpu_plan_reads_every_folder_of_its_kind_newest_first_then_another_kinds_wall_clocks(tmp_path, capsys):
    """A GPU's plan reads every committed folder of its kind, newest first, then another kind's measured wall clocks.

    The H100's newest folder (records/h100-2026-11-27, a quick run's) lacks speed_5 and the fast ladder: they come
    from records/h100-2026-11-24, not the H200's records; the H200's newest (records/h200-2026-12-04, a quick run's)
    has the speedrun to speedrun_21 and no ladder: speed_1 comes from the next (records/h200-2026-11-28), which
    lacks fast_4, which comes from the oldest. speedrun_14, which no H100 ran, comes from the H200's measured wall
    clock, before rule 5's model (a third too slow on the H100); speedrun_22, which no GPU finished, from that
    model. The GPU tests take the seconds of this kind's committed run of them (gpu_tests.json), else their cap; a
    stage that needs 2 GPUs costs its start-up and says why."""
    h100, h200 = (planned(capsys, kind, tmp_path / "q") for kind in ("H100", "H200"))
    for stage in ("speed_5_amp", "fast_1_pretokenized", "fast_5_fused_adamw"):
        assert h100[("speed" if stage.startswith("speed") else "fast", stage)][1].startswith("h100-2026-11-24: ")
    assert h100[("speed", "speed_1_batch_size")][1] == "h100-2026-11-27's wall clock"
    assert h200[("speedrun", "speedrun_1_systems")] == (46, "h200-2026-12-04's wall clock")
    assert h200[("speed", "speed_1_batch_size")] == (12, "h200-2026-11-28's wall clock")  # the newest lacks it
    assert h200[("fast", "fast_4_padded_vocab")][1].startswith("h200-2026-11-27: ")  # the two newest lack it
    assert h100[("speedrun", "speedrun_14_adamw_rate")] == (15, "h200-2026-12-04's wall clock")  # no H100 has it
    assert h200[("speedrun", "speedrun_22_eval_near_target")][1].startswith("h200-2026-11-28: speed_0's 2000 steps")
    assert h100[("gpu tests", "pytest")] == (37, "h100-2026-11-27's run of them")
    assert h200[("gpu tests", "pytest")] == (28, "h200-2026-12-04's run of them")
    assert h100[("speed", "speed_6_ddp")] == (
        10,
        "start-up only, then it records itself skipped: needs 2 GPUs, planned for 1",
    )


def test_a_dry_run_prepares_runs_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """--dry-run prints the plan (the memory ladder's too, and the CPU's) and starts no process, writing nothing."""

    def nothing(*args, **kwargs):
        pytest.fail("a dry run started something")

    for module, name in ((run_all, "prepare_data"), (run_all, "run_stage"), (quick_run, "run_stage")):
        monkeypatch.setattr(module, name, nothing)
    monkeypatch.setattr(subprocess, "Popen", nothing)
    out = tmp_path / "q"
    memory = dry_run(capsys, "--gpu", "H200", "--only", "memory", "--out", str(out))
    planned = [line.split(": ")[1].split()[0] for line in memory[2:-1] if not line.startswith("   not run")]
    assert planned[:5] == run_all.stages_of("memory")  # then the planner's reports, kept or left out
    reports = [r for r in ("compare", "reference", "fit") if r in planned or f"gpt.memory {r} " in memory[-2]]
    assert reports == ["compare", "reference", "fit"]
    cpu = dry_run(capsys, "--device", "cpu", "--out", str(out))
    assert "cpu-cpu's wall clock" in cpu[2] and cpu[-1].startswith("total: ")
    assert not out.exists()


def test_the_limit_keeps_room_for_the_report_and_a_run_reads_its_earlier_wall_clocks(tmp_path):
    deadline = quick_run.Deadline(limit_s=100.0, start=time.monotonic())
    assert 94 < deadline.left() <= 95 and not deadline.passed() and deadline.label == "1 min 40 s"
    assert quick_run.Deadline(limit_s=100.0, start=time.monotonic() - 96).passed()
    write_record(tmp_path / "speed_1_batch_size.json", {"stage": "speed_1_batch_size", "status": "ok"})
    quick_run.mark(tmp_path / "speed_1_batch_size.json", 10.0, quick=True)
    assert read_record(tmp_path / "speed_1_batch_size.json")["run"] == {"quick": True, "wall_s": 10.0}
    figures = quick_run.Figures(tmp_path, [tmp_path / "none"], "smoke", "cpu")
    assert figures.seconds("speed_1_batch_size", Path("speed_1_batch_size.json"), False) == (
        10.0,
        "this folder's last quick run",
        None,
    )
    assert figures.seconds("speed_2_num_workers", Path("speed_2_num_workers.json"), False)[1] == (
        "speed's slowest recorded stage"
    )
    assert quick_run.stage_arguments({"repeats": 5, "warmup_iters": 10}) == ["--repeats", "2", "--warmup-iters", "5"]


def test_a_plan_keeps_what_fits_from_the_first_and_drops_the_rest():
    items = [quick_run.Item("a", str(i), s, "", "cmd", Path(str(i))) for i, s in enumerate([50, 40, 5, 1])]
    plan = quick_run.Plan(items, budget_s=92)
    assert [i.name for i in plan.kept] == ["0", "1"] and plan.dropped_item(Path("2")).name == "2"
    assert plan.dropped_item(Path("0")) is None and plan.runs("a")


def test_a_figure_from_a_warm_compile_pays_a_cold_one_where_the_stage_that_warmed_it_does_not_run_first(tmp_path):
    """A figure from a warm compile holds only where the stage that filled the cache runs before it in the plan.

    A record whose first step loaded its graphs from the cache its parent filled (fast_5 after fast_4) plans that run
    warm only where the parent runs before it; else its parent's cold compile less its own is added. Seen on the
    H200 (records/h200-2026-11-28/note.md): fast_5 planned at 22 s from a warm record ran cold, 37 s."""
    committed, out = tmp_path / "committed", tmp_path / "out"

    def record(stage, parent, cache, compile_s):
        metrics = {"compile_cache": cache, "compile_s": compile_s, "warmup_s": compile_s + 0.1, "seconds_mean": 0.5}
        record = {"stage": stage, "parent": parent, "status": "ok", "metrics": metrics}
        write_record(committed / f"{stage}.json", record)

    record("fast_3_sdpa", "fast_2_bf16", "warm", 2.0)  # warm from a stage the folder lacks: none known fills it
    record("fast_4_padded_vocab", "fast_3_sdpa", "cold", 20.0)
    record("fast_5_fused_adamw", "fast_4_padded_vocab", "warm", 2.5)
    figures = quick_run.Figures(out, [committed], "reference", "cuda")

    def item(stage):
        seconds, why, warmed = figures.seconds(stage, Path(f"{stage}.json"), False)
        return quick_run.Item("fast", stage, seconds, why, "cmd", out / f"{stage}.json", warmed=warmed)

    warm = quick_run.TIMED_REST_S["fast"] + 2.6 + quick_run.QUICK_REPEATS * 0.5
    both = quick_run.Plan([item("fast_4_padded_vocab"), item("fast_5_fused_adamw")], budget_s=1000)
    assert both.kept[1].seconds == pytest.approx(warm) and "cold" not in both.kept[1].why
    alone = quick_run.Plan([item("fast_5_fused_adamw")], budget_s=1000).kept[0]
    assert alone.seconds == pytest.approx(warm + 17.5)
    assert alone.why.endswith("18 (fast_4_padded_vocab, which compiles its graphs, does not run before it)")
    parent_left_out = quick_run.Plan([item("fast_4_padded_vocab"), item("fast_5_fused_adamw")], budget_s=30)
    assert not parent_left_out.kept and parent_left_out.dropped[1].seconds == pytest.approx(warm + 17.5)
    first = quick_run.Plan([item("fast_3_sdpa")], budget_s=1000).kept[0]  # the slowest cold compile beside it, 20 s
    assert first.seconds == pytest.approx(quick_run.TIMED_REST_S["fast"] + 2.1 + 1.0 + 18.0)
    assert first.why.endswith("(no stage before it compiles its graphs)")


def test_a_left_out_item_runs_where_the_time_left_covers_it_and_the_planned_items_after_it():
    """Reflow: where the stages ran faster than planned, an item the plan left out runs after all.

    It runs where the time left, less the expected seconds of the planned items still to run after it, covers its own.
    A stage that cannot run here (the last) is planned wherever it stands, its seconds counted first."""
    items = [quick_run.Item("a", str(i), s, "", "cmd", Path(str(i))) for i, s in enumerate([50, 40, 30, 10])]
    items[3].cannot_run = "needs 2 GPUs, found 1"
    plan = quick_run.Plan(items, budget_s=95)  # 10 + 50, and 40 more would be 100
    assert [i.name for i in plan.kept] == ["0", "3"] and [i.name for i in plan.dropped] == ["1", "2"]
    assert plan.fits_now(items[1], left_s=50) and not plan.fits_now(items[1], left_s=49.9)  # 10 s of item 3 to come
    assert plan.fits_now(items[2], left_s=40) and not plan.fits_now(items[2], left_s=39.9)


def test_the_gpu_tests_say_why_they_skipped_and_their_closing_line_is_still_found():
    """The GPU tests' command lists skip reasons (-rs); the closing line is pytest's summary, after those reasons."""
    assert "-rs" in quick_run.gpu_tests_command()
    output = (
        "....s.s..s..\n"
        "============= short test summary info =============\n"
        "SKIPPED [3] tests/test_gpu.py:88: the chunked loss needs PyTorch 2.12 or newer, or liger-kernel\n"
        "===== 9 passed, 3 skipped, 2 warnings in 27.13s =====\n"
    )
    assert quick_run.closing_line(output) == "9 passed, 3 skipped, 2 warnings in 27.13s"


def test_on_a_machine_whose_compile_cache_is_empty_every_compiled_stage_not_seen_sharing_is_planned_cold(tmp_path):
    """On a machine whose compile cache is empty, a warm record plans a cold compile unless its run showed the sharing.

    records/cpu-cpu of c42133b was made on a machine whose caches were warm from an earlier run: every compiled record
    says "warm", 2-3 s a first step, and its ancestors tell nothing about which stage's graphs it loaded. A quick run
    whose caches held nothing for its torch (2.11 on that machine, records/cpu-epyc-bf16-2026-12-07-torch211-quick)
    compiled speedrun_1, _2, _4, _6, _9, _10 and speed_4 to fast_1 cold, 19-48 s a first step, where the plan had added
    6 s to speedrun_1 and to speed_4 alone: it planned 16 min 26 s and reached its 20 min limit with five fast stages
    left. Here the cold figure comes from the newest other run of the same machine and torch (the stage's own where it
    compiled cold there); a stage whose run saw its parent compile cold stays warm after it."""
    records = tmp_path / "records"
    machine = {"profile": "cpu", "device": "cpu", "cpu": "a CPU", "torch": "2.13.0+cpu"}

    def run(name, finished, states, **other):
        write_record(records / name / "machine.json", {**machine, **other, "finished": finished})
        for stage, (parent, cache, first_s) in states.items():
            metrics = {"compile_cache": cache, "compile_s": first_s, "warmup_s": first_s + 0.1, "seconds_mean": 0.5}
            record = {"stage": stage, "parent": parent, "status": "ok", "metrics": metrics}
            write_record(records / name / f"{stage}.json", record)

    warm = {
        "fast_3_sdpa": ("fast_2_bf16", "warm", 2.0),
        "fast_4_padded_vocab": ("fast_3_sdpa", "warm", 2.0),
        "fast_5_fused_adamw": ("fast_4_padded_vocab", "warm", 2.5),
    }
    run("cpu-cpu", "2026-12-07T13:00:00", warm)
    run("kept-older", "2026-12-06T00:00:00", {"fast_4_padded_vocab": ("fast_3_sdpa", "cold", 99.0)})
    cold = {"fast_4_padded_vocab": ("fast_3_sdpa", "cold", 30.0), "fast_5_fused_adamw": (None, "cold", 40.0)}
    run("kept-cold", "2026-12-07T11:00:00", cold)
    run("kept-other-cpu", "2026-12-07T12:00:00", {"fast_4_padded_vocab": ("fast_3_sdpa", "cold", 50.0)}, cpu="another")
    run("kept-other-torch", "2026-12-07T12:10:00", {"fast_4_padded_vocab": ("fast_3_sdpa", "cold", 60.0)}, torch="2.11")
    run("kept-seen", "2026-12-05T00:00:00", {"fast_2_bf16": ("fast_1_pretokenized", "cold", 25.0), **warm})
    figures = quick_run.Figures(tmp_path / "out", [records / "cpu-cpu"], "cpu", "cpu")

    def plan(cold_cache, folder="cpu-cpu", stages=tuple(warm)):
        figures.committed = [records / folder]
        items = []
        for stage in stages:
            seconds, why, warmed = figures.seconds(stage, Path(f"{stage}.json"), False)
            record = tmp_path / "out" / f"{stage}.json"
            items.append(quick_run.Item("fast", stage, seconds, why, "cmd", record, warmed=warmed))
        return {item.name: item for item in quick_run.Plan(items, 1000, cold_cache).kept}

    rest = quick_run.TIMED_REST_S["fast"] + 0.1 + quick_run.QUICK_REPEATS * 0.5
    cold = plan(cold_cache=True)  # the newest run of the same CPU with cold compiles: a stage's own, else the slowest
    assert [cold[s].seconds - rest for s in warm] == pytest.approx([40.0, 30.0, 40.0])
    assert "this machine's compile cache is empty" in cold["fast_4_padded_vocab"].why
    warm_cache = plan(cold_cache=False)  # as before: only the first, which no stage before it compiles for
    assert [warm_cache[s].seconds - rest for s in warm] == pytest.approx([40.0, 2.0, 2.5])
    seen = plan(cold_cache=True, folder="kept-seen")  # fast_3 loaded what fast_2 compiled cold in that run
    assert "fast_2_bf16, which compiles its graphs, does not run before it" in seen["fast_3_sdpa"].why
    seen = plan(cold_cache=True, folder="kept-seen", stages=("fast_2_bf16", "fast_3_sdpa"))  # and fast_2 runs first
    assert seen["fast_3_sdpa"].seconds - rest == pytest.approx(2.0) and "cold" not in seen["fast_3_sdpa"].why


def test_the_compile_cache_is_empty_until_a_process_compiles_into_it(tmp_path, monkeypatch):
    """The plan reads the folder the stages compile into: TORCHINDUCTOR_CACHE_DIR, or Inductor's default."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    assert quick_run.compile_cache_is_empty()
    compile_one = "import torch; torch.compile(lambda x: x.sin() * 2)(torch.ones(3))"
    subprocess.run([sys.executable, "-c", compile_one], check=True, timeout=300)
    assert not quick_run.compile_cache_is_empty()


def test_a_planner_report_is_planned_at_its_start_up_where_reused_else_at_its_recorded_seconds(tmp_path):
    """Figures.planner: a reused report costs its start-up; one computed, the seconds its nearest record took.

    This folder's earlier run first, then this kind's committed folders, then (reference and fit, which do not depend
    on the machine) the committed CPU run's; on a GPU, compare is bounded by the reference report's seconds; without
    a figure, 0 s. Before this rule the memory quick run on torch 2.11 planned 221 s and took 449 s: the three reports
    were not planned and ran past its stages' deadline (records/cpu-epyc-bf16-2026-12-07-torch211-ladders/note.md)."""
    own, committed, start = tmp_path / "own", tmp_path / "h100-x", quick_run.PLANNER_START_S
    cpu_run = quick_run.published_dir("cpu", "cpu")
    figures = quick_run.Figures(own, [committed], "reference", "cuda")
    reused = figures.planner("memory_fit.json", committed / "memory_fit.json", True)
    assert reused == (start, "start-up only: reused from h100-x, its code and torch unchanged")
    assert figures.planner("memory_nothing.json", None, False) == (0.0, "no figure: the limit bounds it")
    if (cpu_fit := read_record(cpu_run / "memory_fit.json") or {}).get("seconds") is not None:
        assert figures.planner("memory_fit.json", None, True)[0] == start + cpu_fit["seconds"]
    write_record(committed / "memory_fit.json", {"seconds": 100.0})
    assert figures.planner("memory_fit.json", None, True) == (
        start + 100,
        f"h100-x: 100 s computing + start-up {start:g}",
    )
    write_record(own / "memory_fit.json", {"seconds": 40.0})
    assert figures.planner("memory_fit.json", None, True)[0] == start + 40
    write_record(committed / "memory_reference.json", {"seconds": 70.0})
    bounded = figures.planner("memory_compare.json", None, False, bound="memory_reference.json")
    assert bounded == (start + 70, f"h100-x: its memory_reference (an upper bound) 70 s computing + start-up {start:g}")
    on_a_cpu = quick_run.Figures(own, [committed], "cpu", "cpu")
    assert on_a_cpu.planner("memory_compare.json", None, False, bound="memory_reference.json")[0] == 0.0


def test_a_memory_quick_run_plans_the_planner_after_the_ladder_and_runs_in_turn_what_its_plan_keeps(
    tmp_path, capsys, monkeypatch
):
    """`--quick --only memory`: the planner's three reports come after the memory ladder in the plan and the run.

    The dry run plans each (reused where its committed record still holds, at its start-up); the run runs them one at
    a time, each the plan kept, with its wall clock in quick_run.json's item; one left out says so with the command
    that computes it, and an earlier run's file of it is removed, so that the page does not show it as this run's."""
    out = tmp_path / "q"
    lines = dry_run(capsys, "--gpu", "H100", "--only", "memory", "--time-limit", "60", "--out", str(out))
    items = [line.split(": ", 1) for line in lines[2:-1]]
    assert [(section.split()[-2:], name.split()[0]) for section, name in items][-3:] == [
        (["memory", "planner"], report) for report in ("compare", "reference", "fit")
    ]
    assert [name.split()[0] for _, name in items[:-3]] == run_all.stages_of("memory")

    # the plan keeps compare; reference does not fit, so fit is left out after it; 57 s left covers neither
    reports = {"compare": 30.0, "reference": 500.0, "fit": 60.0}
    plan = quick_run.Plan(
        [
            quick_run.Item(quick_run.PLANNER, name, s, "", f"python -m gpt.memory {name}", out / f"memory_{name}.json")
            for name, s in reports.items()
        ],
        budget_s=100,
    )
    assert [i.name for i in plan.kept] == ["compare"]
    out.mkdir()
    (out / "memory_fit.json").write_text("{}")  # an earlier run's
    args = run_all.parse_args(["--quick", "--only", "memory", "--out", str(out)])
    args.plan, args.deadline = plan, quick_run.Deadline.starting_now(1.0)
    started = []
    monkeypatch.setattr(run_all, "run_stage", lambda cmd, log, show, deadline: started.append(cmd[3]) or 0)
    run_all.run_memory_planner(out, None, args)
    printed = capsys.readouterr().out
    assert started == ["compare"] and plan.item_of(out / "memory_compare.json").wall_s is not None
    assert "[planner] fit: not run: the quick run's plan for 1 min 0 s had no room for it" in printed
    assert "(`python -m gpt.memory reference` runs it)" in printed and not (out / "memory_fit.json").exists()


@pytest.mark.parametrize("kind", quick_run.GPU_KINDS)
def test_the_memory_plan_of_a_gpu_has_a_figure_for_each_planner_report_and_keeps_its_7_minutes(kind, tmp_path, capsys):
    """`--quick --only memory --dry-run --gpu H100` (or H200), from the committed records: every planner report planned.

    Each of the three has a figure (none "no figure": the committed CPU run's records hold their seconds, and compare
    on a GPU is bounded by the reference report's), what the plan keeps fits 7 minutes less the report's share, and
    each report it leaves out is named with its own command, which reuses no file that is not there. Seen failing on
    the records before the run of 9cce7a8, which held no seconds: the three planned at 0 s, the defect the torch 2.11
    memory quick run showed (221 s planned, 449 s taken); and on 9cce7a8's code, whose commands reused files of
    records/reference-cuda/, a folder no run commits (a GPU's records are dated)."""
    out = tmp_path / "q"
    args = run_all.parse_args(["--quick", "--dry-run", "--gpu", kind, "--only", "memory", "--out", str(out)])
    plan = run_all.quick_plan(args, "reference", "cuda", out)
    printed = capsys.readouterr().out
    reports = [item for item in plan.items if item.section == quick_run.PLANNER]
    assert [item.name for item in reports] == ["compare", "reference", "fit"]
    assert all(item.seconds > quick_run.PLANNER_START_S and "no figure" not in item.why for item in reports), [
        (item.name, item.seconds, item.why) for item in reports
    ]
    assert "memory_reference (an upper bound)" in reports[0].why
    assert sum(item.seconds for item in plan.kept) <= 7 * 60 * (1 - quick_run.REPORT_RESERVE)
    for item in plan.dropped:
        assert item.command in printed and item.command.startswith("python -m gpt.memory ")
    for item in reports:  # a GPU's kind commits no records/reference-cuda: a command reuses only a file there is
        words = shlex.split(item.command)
        assert "--reuse" not in words or Path(words[words.index("--reuse") + 1]).is_file(), item.command


def test_the_memory_plan_of_this_cpu_reuses_the_committed_planner_reports_where_they_still_hold(tmp_path, capsys):
    """On this CPU, the committed run's reference and fit reports are reused at their start-up where they still hold.

    They hold where the committed records were computed from this code and this torch (records/cpu-cpu's provenance):
    then the plan counts PLANNER_START_S each; compare is always computed, at its committed seconds."""
    from gpt.memory.__main__ import reusable

    out, committed = tmp_path / "q", quick_run.published_dir("cpu", "cpu")
    args = run_all.parse_args(["--quick", "--dry-run", "--device", "cpu", "--only", "memory", "--out", str(out)])
    plan = run_all.quick_plan(args, "cpu", "cpu", out)
    capsys.readouterr()
    reports = {item.name: item for item in plan.items if item.section == quick_run.PLANNER}
    compare_s = read_record(committed / "memory_compare.json")["seconds"]
    assert reports["compare"].seconds == quick_run.PLANNER_START_S + compare_s
    for name in ("reference", "fit"):
        argv = run_all.planner_commands(out, committed)[name]
        if reusable(argv, committed / f"memory_{name}.json"):
            assert reports[name].seconds == quick_run.PLANNER_START_S and "reused from cpu-cpu" in reports[name].why
        else:  # another torch than the committed run's, say 2.11: computed, at the committed seconds
            seconds = read_record(committed / f"memory_{name}.json")["seconds"]
            assert reports[name].seconds == quick_run.PLANNER_START_S + seconds

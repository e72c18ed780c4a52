"""The quick run's own parts (gpt/quick.py): its GPU tests' closing line and time cap, its limit, its estimate.

The run itself is tested with stub stages in tests/test_report.py."""

import subprocess
import time

import pytest

from gpt import quick
from gpt.records import read_record, write_record


def test_the_gpu_tests_closing_line_is_recorded_and_a_cut_run_says_so(tmp_path, monkeypatch):
    deadline = quick.Deadline.starting_now(4.0)  # a quarter of it, 1 minute, for the tests
    caps = []

    def finished(cmd, stdout, timeout, **kwargs):
        caps.append(timeout)
        stdout.write("....s\n========== 30 passed, 6 skipped, 52 warnings in 101.97s (0:01:41) ==========\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(quick.subprocess, "run", finished)
    result = quick.run_gpu_tests(tmp_path, deadline)
    assert result["summary"] == "30 passed, 6 skipped, 52 warnings in 101.97s (0:01:41)" and result["exit_code"] == 0
    assert caps == [pytest.approx(60, abs=1)] and read_record(tmp_path / "gpu_tests.json") == result

    def cut(cmd, stdout, timeout, **kwargs):
        stdout.write("tests/test_gpu.py ....\n")
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(quick.subprocess, "run", cut)
    result = quick.run_gpu_tests(tmp_path, deadline)
    assert result["exit_code"] is None and result["summary"].startswith("stopped at 1 min 0 s; last line: tests/")


def test_the_limit_keeps_room_for_the_report_and_the_estimate_reads_earlier_wall_clocks(tmp_path):
    deadline = quick.Deadline(limit_s=100.0, start=time.monotonic())
    assert 94 < deadline.left() <= 95 and not deadline.passed() and deadline.label == "1 min 40 s"
    assert quick.Deadline(limit_s=100.0, start=time.monotonic() - 96).passed()
    for i, name in enumerate(["a", "b"]):
        write_record(tmp_path / f"{name}.json", {"stage": name})
        quick.mark(tmp_path / f"{name}.json", 10.0 * (i + 1), quick=True)
    assert read_record(tmp_path / "a.json")["run"] == {"quick": True, "wall_s": 10.0}
    assert quick.estimate([tmp_path / "a.json", tmp_path / "b.json", tmp_path / "missing.json"]) == (30.0, 2)
    assert quick.stage_arguments({"repeats": 5, "warmup_iters": 10}) == ["--repeats", "2", "--warmup-iters", "5"]

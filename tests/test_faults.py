"""The failure paths, tried for real.

A rank that raises or is killed, two ladders into one directory, an output directory that cannot be written, a corrupt
record, and a stage run alone on a fresh checkout.

The dying-rank tests run the real stage command (2 gloo processes under torchrun); tests/stage_hooks/sitecustomize.py,
which Python runs at start-up from PYTHONPATH, injects the fault. Every process they start carries a marker in its
environment, so the tests can check that none is left behind, whatever session torchrun put it in.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import REPO
from record_schema import record_problems
from test_report import fake_record, running, stub_stages  # noqa: F401 (stub_stages is a fixture)

from gpt import run_all, supervision
from gpt.ladder import STAGES_DIR, all_stages, stages_of, timed_ladders
from gpt.run_all import stage_command as real_stage_command

HOOKS = REPO / "tests" / "stage_hooks"  # holds sitecustomize.py
ALL_STAGES = all_stages()
FAILURE_BOUND_S = 60  # a stage ends at most this long after one of its ranks failed (seconds, on the CPU)
STAGE_TIMEOUT_S = 300  # only a guard against a hang: a loaded 2-core machine is slow to start torch
STRAGGLER_S = 10  # for processes already signalled when the stage ended to be gone, on a loaded machine


def marked_env(**extra) -> tuple[dict, str]:
    """The environment for a stage under test: the hooks, one thread per process, and a marker."""
    marker = uuid.uuid4().hex
    path = os.pathsep.join(p for p in (str(HOOKS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "GPT_TEST_MARKER": marker, **extra}
    return env, marker


def processes_with(marker: str) -> list[int]:
    """Live processes whose environment carries `marker`: a stage and everything it started, in any session.

    torchrun gives each rank a session of its own. A process's /proc environ is the one it started with."""
    needle = f"GPT_TEST_MARKER={marker}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in environ.split(b"\0") and running(int(entry)):
            found.append(int(entry))
    return found


def assert_nothing_left(marker: str) -> None:
    deadline = time.monotonic() + STRAGGLER_S
    while (left := processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    commands = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120] for pid in left}
    for pid in left:  # clean up before failing, so that one failure does not load the next tests
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes left behind {STRAGGLER_S} s after the stage ended: {commands}"


def run_marked(cmd: list[str], env: dict, marker: str, log: Path) -> int:
    """Run a command with its output in `log`; on a hang, kill everything it started and fail."""
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=STAGE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for pid in processes_with(marker):
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"{cmd[1]} did not end in {STAGE_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


# ---- a rank that fails ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(
                    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 GPUs"
                ),
            ],
        ),
    ],
)
def test_a_rank_that_raises_ends_the_stage_with_its_error(device, tmp_path, char_data):
    """A rank that raises ends the stage with its error.

    Rank 1 raises in its third step while rank 0 waits in FSDP's all-gather: rank 1 reports its error and leaves without
    a barrier (NCCL: aborts its communicator), torchrun stops rank 0; the record names rank 1 and its error. Without the
    fix, rank 1 waits in a barrier and the stage hangs for 30 minutes."""
    failed_at, out = tmp_path / "failed_at", tmp_path / "out"
    env, marker = marked_env(HOOK_FAULT=f"raise:1:2:{failed_at}")
    cmd = [
        sys.executable,
        str(STAGES_DIR / "memory_4_fsdp.py"),
        "--profile",
        "smoke",
        "--device",
        device,
        "--data-dir",
        str(char_data),
        "--out",
        str(out),
        "--wandb",
        "disabled",
    ]
    rc = run_marked(cmd, env, marker, tmp_path / "stage.log")
    ended = time.time()
    log = (tmp_path / "stage.log").read_text()
    assert rc == 1, log[-3000:]
    assert ended - float(failed_at.read_text()) < FAILURE_BOUND_S
    record = json.loads((out / "memory_4_fsdp.json").read_text())
    assert record["status"] == "failed" and not record_problems(record)
    assert record["reason"] == "rank 1: RuntimeError: injected failure on rank 1 after 2 steps"
    assert "memory_4_fsdp: failed: rank 1: RuntimeError: injected failure" in log  # the summary says it too
    assert_nothing_left(marker)


@pytest.mark.parametrize(
    "stage",
    [
        "memory_4_fsdp",  # eager, no DataLoader workers: seconds
        pytest.param("speed_6_ddp", marks=pytest.mark.slow),  # compiled, 4 DataLoader workers per rank: minutes
    ],
)
def test_run_all_goes_on_after_a_rank_is_killed(stage, stub_stages, char_data, monkeypatch):
    """run_all goes on after a rank is killed, and no process of the stage survives it.

    Rank 1 of a 2-process stage is SIGKILLed inside its third step's forward: the stage ends in bounded time, its record
    says so, run_all runs the next stages, and no process of the stage survives it (for speed_6_ddp neither the compile
    workers nor the 4 DataLoader workers of each rank: the slow case)."""
    out, behave, calls = stub_stages
    for other in ALL_STAGES:
        if other != stage:
            behave(other, "ok", fake_record(other))
    killed_at = out.parent / "killed_at"
    env, marker = marked_env(HOOK_FAULT=f"kill:1:2:{killed_at}")
    hooked = [f"{key}={env[key]}" for key in ("PYTHONPATH", "OMP_NUM_THREADS", "GPT_TEST_MARKER", "HOOK_FAULT")]
    stub_command = run_all.stage_command  # the hooks for the stage under test alone: they import torch in the stubs
    monkeypatch.setattr(
        run_all,
        "stage_command",
        lambda name, *args: (
            ["env", *hooked, *real_stage_command(name, *args), "--data-dir", str(char_data)]
            if name == stage
            else stub_command(name, *args)
        ),
    )
    monkeypatch.setattr(run_all, "run_memory_planner", lambda out, reuse_from, args=None: None)
    monkeypatch.setattr(run_all, "SECTIONS", timed_ladders())  # the ladders only: no training to a loss after them
    ended, real_run_stage = {}, run_all.run_stage

    def timed_run_stage(cmd, log, show, deadline=None):
        rc = real_run_stage(cmd, log, show, deadline)
        ended[Path(log).stem] = time.time()
        return rc

    monkeypatch.setattr(run_all, "run_stage", timed_run_stage)
    rc = run_all.main(["--profile", "smoke", "--device", "cpu", "--out", str(out), "--wandb", "disabled"])
    log = (out / f"{stage}.log").read_text()
    assert rc == 1, log[-3000:]
    assert ended[stage] - float(killed_at.read_text()) < FAILURE_BOUND_S
    record = json.loads((out / f"{stage}.json").read_text())
    assert record["status"] == "failed" and record["reason"] == "rank 1: killed by SIGKILL", log[-3000:]
    assert not record_problems(record)
    timed = stages_of(*timed_ladders())
    assert calls() == [s for s in timed if s != stage]  # the stages after it ran
    assert "**failed**: rank 1: killed by SIGKILL" in (out / "results.md").read_text()
    assert_nothing_left(marker)


# ---- two ladders, one output directory ------------------------------------------------------------------

SPEED_ARGS = ["--profile", "smoke", "--device", "cpu", "--only", "speed", "--wandb", "disabled"]


def test_a_second_ladder_into_the_same_directory_is_refused(stub_stages, capsys):
    out, behave, calls = stub_stages
    for stage in stages_of("speed"):
        behave(stage, "ok", fake_record(stage))
    holder = subprocess.Popen(  # another ladder, holding the directory
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from gpt.run_all import lock_output; "
            "lock = lock_output(Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()",
            str(out),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(SystemExit) as e:
            run_all.main([*SPEED_ARGS, "--out", str(out)])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [
            f"error: another ladder (pid {holder.pid}) is writing to {out}: wait for it to finish, "
            "or give this one another --out"
        ]
        assert calls() == []  # refused before any stage ran
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # its lock file remains, naming a process that is gone: the next ladder takes it over
    assert (out / supervision.LOCK_FILE).read_text().strip() == str(holder.pid)
    assert run_all.main([*SPEED_ARGS, "--out", str(out)]) == 0
    assert calls() == stages_of("speed")


# ---- an output directory that cannot be written -----------------------------------------------------------


def writable(path: Path) -> bool:
    try:
        (path / ".probe").write_text("")
    except OSError:
        return False
    (path / ".probe").unlink()
    return True


@contextmanager
def blocked_output(tmp_path: Path, how: str):
    """An output directory that cannot be written: a file in its place, or a read-only directory.

    Root ignores permissions, so there the directory is made immutable, where the filesystem allows it, or else /sys is
    used: sysfs refuses a new file even to root."""
    path = tmp_path / "blocked"
    if how == "file in the way":
        path.write_text("not a directory")
        yield path, "is a file"
        return
    path.mkdir()
    path.chmod(0o555)
    immutable = (
        writable(path)
        and shutil.which("chattr") is not None
        and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    )
    try:
        blocked = path if not writable(path) else Path("/sys")  # /sys: only read, never changed
        if not blocked.is_dir() or writable(blocked):
            pytest.skip("cannot make a directory read-only here")
        yield blocked, "cannot write to the output directory"
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)])
        path.chmod(0o755)


# a stage of one process, and one that would launch two
@pytest.mark.parametrize("how, stage", [("file in the way", "speed_0_baseline"), ("read-only", "memory_4_fsdp")])
def test_an_unwritable_output_directory_is_one_line_before_any_training(
    how, stage, tmp_path, stub_stages, capsys, char_data
):
    out, behave, calls = stub_stages
    with blocked_output(tmp_path, how) as (blocked, message):
        with pytest.raises(SystemExit) as e:
            run_all.main([*SPEED_ARGS, "--out", str(blocked)])
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and message in err[0] and str(blocked) in err[0]
        assert calls() == []
        r = subprocess.run(
            [
                sys.executable,
                str(STAGES_DIR / f"{stage}.py"),
                "--profile",
                "smoke",
                "--device",
                "cpu",
                "--data-dir",
                str(char_data),
                "--out",
                str(blocked),
                "--wandb",
                "disabled",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr
        assert r.stdout == ""  # no training, no launch


# ---- a corrupt record ---------------------------------------------------------------------------------------


def test_a_corrupt_record_is_reported_and_rerun_on_resume(stub_stages, capsys):
    out, behave, calls = stub_stages
    for stage in stages_of("speed"):
        behave(stage, "ok", fake_record(stage))
    args = [*SPEED_ARGS, "--out", str(out)]
    assert run_all.main(args) == 0
    corrupt = out / "speed_3_non_blocking.json"
    corrupt.write_text(corrupt.read_text()[:200])  # cut short, as by a full disk
    kept = {p.name: p.read_text() for p in out.glob("speed_*.json") if p != corrupt}
    message = f"unreadable, will rerun: {corrupt}"

    r = subprocess.run([sys.executable, "-m", "gpt.report", "--runs", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and message in r.stderr, r.stderr
    capsys.readouterr()
    behave("speed_3_non_blocking", "ok", fake_record("speed_3_non_blocking"))  # the stub moved it away
    assert run_all.main([*args, "--resume"]) == 0
    assert message in capsys.readouterr().err
    assert calls() == stages_of("speed") + ["speed_3_non_blocking"]  # only that stage ran again
    assert json.loads(corrupt.read_text())["status"] == "ok"
    assert {p.name: p.read_text() for p in out.glob("speed_*.json") if p != corrupt} == kept


# ---- a first run --------------------------------------------------------------------------------------------


def test_a_stage_run_alone_prepares_its_default_data(tmp_path):
    """A fresh checkout (a copy of the code, no data): the stage prepares the profile's data set itself."""
    clone = tmp_path / "clone"
    for d in ("gpt", "stages"):
        shutil.copytree(REPO / d, clone / d, ignore=shutil.ignore_patterns("__pycache__"))
    (clone / "data").mkdir()
    shutil.copy(REPO / "data" / "prepare.py", clone / "data")
    r = subprocess.run(
        [
            sys.executable,
            str(clone / "stages" / "speed_0_baseline.py"),
            "--profile",
            "smoke",
            "--device",
            "cpu",
            "--samples",
            "8",
            "--repeats",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--wandb",
            "disabled",
        ],
        env={**os.environ, "PYTHONPATH": str(clone)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data_dir = clone / "data" / "shakespeare_char"
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("preparing")] == [
        f"preparing the default data set in {data_dir}: python data/prepare.py --tokenizer char"
    ]
    assert (data_dir / "meta.json").is_file()
    assert json.loads((tmp_path / "out" / "speed_0_baseline.json").read_text())["status"] == "ok"

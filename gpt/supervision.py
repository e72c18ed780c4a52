"""Process supervision for run_all: the output folder's lock, the stages' child processes, and the progress line.

One run per output folder (a lock); each stage a child process in its own session with its output in a log, stopped
with everything it started on Ctrl-C or at a quick run's limit; and the progress line's numbering and clock. What to
run, and in which order, is gpt/run_all.py's."""

import fcntl
import os
import signal
import subprocess
import time
from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.errors import UserError

LOCK_FILE = ".run_all.lock"


def lock_output(out: Path):
    """Make this run the only ladder writing to `out`: the open lock file, held until this process exits.

    The lock is the kernel's (flock), released however its holder ends: a lock file left by a dead run is taken over."""
    path = out / LOCK_FILE
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "unknown"
            f.close()
            raise UserError(
                f"another ladder (pid {holder}) is writing to {out}: wait for it to finish, "
                "or give this one another --out"
            ) from None
        if os.path.exists(path) and os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
            break
        f.close()  # the file was replaced while this process waited for it: lock the new one
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def stop_tree(proc: subprocess.Popen) -> None:
    """Stop a stage and everything it started (torchrun, its ranks, DataLoader workers).

    They share the stage's own process group. SIGINT first so each can exit cleanly, then SIGKILL for what remains."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this short
    try:
        for sig, grace in ((signal.SIGINT, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
    finally:
        signal.signal(signal.SIGINT, previous)


def last_line(log: Path) -> str:
    """The last meaningful line of a stage's log (an error message, usually); progress bars skipped."""
    try:
        lines = log.read_text(errors="replace").replace("\r", "\n").splitlines()
    except OSError:
        return ""
    lines = [ln.strip() for ln in lines if ln.strip() and "%|" not in ln]  # "%|" marks a tqdm bar
    return lines[-1][:200] if lines else ""


class TimeLimitReached(Exception):
    """The quick run's limit came while a stage ran: the stage was stopped."""


def run_stage(cmd: list[str], log: Path, show, deadline=None) -> int:
    """Run one stage script with its output in `log`, `show(seconds)` once a second; returns its exit code.

    KeyboardInterrupt after stopping the stage if interrupted; TimeLimitReached if `deadline` (quick_run's) passed
    first."""
    with open(log, "w") as f:
        # its own session: a Ctrl-C reaches only this process, which then stops the whole stage tree
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO_ROOT, start_new_session=True
        )
        t0 = time.monotonic()
        try:
            while True:
                try:
                    return proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    show(time.monotonic() - t0)
                    if deadline and deadline.passed():
                        raise TimeLimitReached from None
        except BaseException:
            stop_tree(proc)
            raise


def clock(seconds: float) -> str:
    return time.strftime("%H:%M:%S" if seconds >= 3600 else "%M:%S", time.gmtime(seconds))


class Progress:
    """The numbering of the stage lines across the sections ([i/N]), and the run's total clock."""

    def __init__(self, total: int):
        self.total, self.done, self.start = total, 0, time.monotonic()

    def prefix(self, name: str) -> str:
        """The next stage line's start: its number of the total, and the job's name."""
        self.done += 1
        return f"[{self.done:>2}/{self.total}] {name:<24}"

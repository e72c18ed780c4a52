"""Process groups for the DDP and FSDP stages: launching, joining, leaving cleanly, and what happens when a rank fails.

Launching is through torchrun. A failed rank must not hang the others: it reports its error in the group's store
(the first report wins) and leaves without waiting; how the others then end: docs/distributed.md#when-something-fails.
"""

import json
import os
import signal
import sys
from contextlib import contextmanager
from datetime import timedelta

import torch
import torch.distributed as dist

from gpt.errors import UserError
from gpt.records import failure_of

# How long a rank waits in one collective before it gives up (NCCL's default; gloo's is 30 minutes): far longer than
# any legitimate wait here, it bounds a stage only when a peer dies where no one sees it (another machine).
PROCESS_GROUP_TIMEOUT = timedelta(minutes=10)
FIRST_FAILURE_KEY = "gpt_ladder/first_failure"


def under_torchrun() -> bool:
    return "LOCAL_RANK" in os.environ and "WORLD_SIZE" in os.environ


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def why_cannot_run(nproc: int, device_type: str) -> str | None:
    """None if `nproc` processes can run on this device type, else the reason (for a 'skipped' record)."""
    if device_type == "cuda":
        found = torch.cuda.device_count()
        if found < nproc:
            return f"needs {nproc} GPUs, found {found}"
        if not dist.is_nccl_available():
            return "this PyTorch build has no NCCL"
        return None
    if not dist.is_gloo_available():
        return "this PyTorch build has no gloo backend"
    return None


def backend_for(device: torch.device, host_collectives: bool = False) -> str:
    """The process group's backend for `device`: NCCL talks GPU to GPU; gloo is the CPU backend.

    `host_collectives` (FSDP's CPU offload, whose clip_grad_norm_ all-reduces host tensors) adds gloo beside NCCL."""
    if device.type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if host_collectives else "nccl"


def init(device: torch.device, backend: str) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device, timeout=PROCESS_GROUP_TIMEOUT)
    else:
        dist.init_process_group(backend, timeout=PROCESS_GROUP_TIMEOUT)


def shutdown(ok: bool = True) -> None:
    """Leave the group: together on success, alone after a failure.

    Together: without the barrier a rank that finishes first can tear the group down while another is still in a
    collective. Alone: the others may wait in a collective this rank will never join, so NCCL is aborted."""
    if not dist.is_initialized():
        return
    if ok:
        dist.barrier()
        dist.destroy_process_group()
    elif "nccl" in dist.get_backend_config():  # "nccl", or "cuda:nccl,cpu:gloo" (get_backend() says so whole)
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()


class RankFailed(Exception):
    """This rank failed inside the group; `first` is the group's first failure: {rank, status, reason}."""

    def __init__(self, first: dict):
        super().__init__(f"rank {first['rank']}: {first['reason']}")
        self.first = first


def first_failure(mine: dict) -> dict:
    """Report this rank's failure ({status, reason}) to the group and return the group's first one.

    The group's store (torchrun's) outlives the ranks, and compare_set is atomic: the first report stays."""
    mine = {**mine, "rank": rank()}
    try:
        store = dist.distributed_c10d._get_default_store()
        return json.loads(store.compare_set(FIRST_FAILURE_KEY, "", json.dumps(mine)))
    except Exception:  # the store is gone too (its host died): this rank's own error is all there is
        return mine


@contextmanager
def process_group(device: torch.device, backend: str | None):
    """Run the body as one rank of a group on `backend` (backend_for's; None: one process, no group).

    An exception leaves the group at once, after reporting it: RankFailed carries the group's first failure, which may
    be another rank's (the error here is often only the consequence, e.g. "Connection closed by peer")."""
    if backend is None:
        yield
        return
    init(device, backend)
    try:
        yield
    except UserError:
        shutdown(ok=False)
        raise
    except Exception as e:
        first = first_failure(failure_of(e))
        shutdown(ok=False)
        raise RankFailed(first) from e
    except BaseException:  # Ctrl-C, SystemExit: leave without waiting for anyone
        shutdown(ok=False)
        raise
    shutdown(ok=True)


# ---------------------------------------------------------------------------------------------------------
# launching


def launch(nproc: int, argv: list[str]) -> dict[int, int]:
    """Re-run this very command as `nproc` processes under torchrun (single node, rendezvous on a free local port).

    torchrun's agent runs in this process, which so learns how each rank ended: {rank: exit code} of those that failed
    (a negative code: the signal that killed it)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    args = ["--standalone", f"--nproc_per_node={nproc}", *argv]
    print(f"launching {nproc} processes: torchrun {' '.join(args)}", file=sys.stderr, flush=True)
    try:
        run(parse_args(args))
    except ChildFailedError as e:
        for failure in e.failures.values():
            # torchrun stops the ranks still running, with their process groups; the children of a rank
            # that died by itself (DataLoader workers) would linger until they notice: end them now
            try:
                os.killpg(failure.pid, signal.SIGKILL)  # each rank leads its own group (torchrun starts it so)
            except (ProcessLookupError, PermissionError):
                pass
        return {r: f.exitcode for r, f in e.failures.items()}
    return {}


def killed_from_outside(failed: dict[int, int]) -> str | None:
    """'rank r: killed by SIGNAL' if a rank was killed by a signal nothing in the run sends, else None.

    Once one rank fails, torchrun stops the others with SIGTERM, and a rank that raises exits with a code. Such a rank
    (the OOM killer, a kill -9, a segfault) is the first failure, and could report nothing itself."""
    killed = [r for r, code in failed.items() if code < 0 and -code != signal.SIGTERM]
    return how_ended({r: failed[r] for r in killed}) if killed else None


def how_ended(failed: dict[int, int]) -> str:
    """The lowest failed rank's end, for a launch whose ranks reported nothing ('rank 1: exit code 2')."""
    r = min(failed)
    code = failed[r]
    return f"rank {r}: " + (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}")

"""Test-only instrumentation of a real stage run, outside the project's code.

Python imports a `sitecustomize` module at start-up from its path: the tests put this directory on PYTHONPATH, so
every process of a stage (the launcher and each torchrun rank, which inherit the environment) runs this file first,
and the tests run the very command a user types. It does nothing unless one of these is set:

    HOOK_FAULT=raise|kill:<rank>:<steps>:<file>
        after <steps> training steps, rank <rank> fails in its next one: it raises, or SIGKILLs itself
        inside the step's forward; first it writes the time of the failure to <file>
    HOOK_DROPOUT=<p>           the stage's dropout, overridden (0 to compare ranks with one process)
    HOOK_SAVE_PARAMS=<file>    every trained parameter, whole, saved by rank 0 to <file>
"""

import os
import signal
import sys
import time
from pathlib import Path

HOOKS = ("HOOK_FAULT", "HOOK_DROPOUT", "HOOK_SAVE_PARAMS")
if any(os.environ.get(h) for h in HOOKS):
    import torch

    from gpt import protocol, stage, train

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from dist_worker import full_params


def this_rank() -> int:
    return int(os.environ.get("RANK", 0))


if os.environ.get("HOOK_FAULT"):
    kind, fault_rank, fault_after, fault_mark = os.environ["HOOK_FAULT"].split(":", 3)
    real_train_step, steps_done = train.train_step, [0]

    def faulty_train_step(model, *args, **kwargs):
        if this_rank() == int(fault_rank) and steps_done[0] == int(fault_after):
            Path(fault_mark).write_text(repr(time.time()))
            if kind == "kill":  # dies inside the forward, while the other ranks are in this step too
                model.register_forward_pre_hook(lambda *_: os.kill(os.getpid(), signal.SIGKILL))
            else:
                raise RuntimeError(f"injected failure on rank {fault_rank} after {fault_after} steps")
        steps_done[0] += 1
        return real_train_step(model, *args, **kwargs)

    train.train_step = faulty_train_step

if os.environ.get("HOOK_DROPOUT"):
    real_stage_config = stage.stage_config

    def stage_config_with_dropout(*args, **kwargs):
        cfg = real_stage_config(*args, **kwargs)
        cfg.dropout = float(os.environ["HOOK_DROPOUT"])
        return cfg

    stage.stage_config = stage_config_with_dropout

if os.environ.get("HOOK_SAVE_PARAMS"):
    real_build_model, real_measure, built = train.build_model, protocol.measure, []

    def build_model_kept(*args, **kwargs):
        built.append(real_build_model(*args, **kwargs))
        return built[-1]

    def measure_and_save(*args, **kwargs):
        record = real_measure(*args, **kwargs)
        params = full_params(built[-1][0])  # a collective under FSDP: every rank takes part
        if this_rank() == 0:
            torch.save(params, os.environ["HOOK_SAVE_PARAMS"])
        return record

    train.build_model, protocol.measure = build_model_kept, measure_and_save

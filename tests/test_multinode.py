"""A distributed stage across two machines, played on this one, trains as one job.

Two torchrun agents with one process each meet through a c10d rendezvous on 127.0.0.1, started with the command README
gives for several machines. They must train as one job: the parameters equal those of one process on the combined batch.

Slow (about two minutes on 2 cores: the DDP stage compiles, in each rank and in the single-process run).
"""

import json
import subprocess
import sys
import uuid

import pytest
import torch
from conftest import REPO, free_port
from record_schema import record_problems
from test_faults import assert_nothing_left, marked_env, run_marked

from gpt.ladder import STAGES_DIR, parent_of, stage_config

# "The same parameters", made precise. Both runs take the same 4 optimizer steps on the same samples, with
# dropout 0 (ranks cannot draw the masks one process draws). FSDP (float32): the gradients are the same sums
# added in another order; AdamW magnifies that rounding only where a gradient is ~0. DDP as speed_6 runs it
# (compiled, bf16 autocast): each rank's weight gradients come out of bf16 matmuls over half the batch, so
# they differ from one process's by bf16 rounding (2^-8 relative), and where a gradient is ~0 AdamW turns
# that into up to a whole step (lr). So the test bounds the share of weights more than a tenth of a step
# apart, and the median difference. Measured here: FSDP 0% and 0, DDP 0.22% and 4e-7 (lr 5e-4). The
# failure this guards against, each node training alone on its half of the batch, measured 97% and 6e-4
# for both stages.
APART = 0.1  # of one step: lr
MAX_SHARE_APART = 0.01
MAX_MEDIAN = 0.01  # of one step


def node_command(stage: str, port: int, job: str, *stage_args: str) -> list[str]:
    """README's multi-machine command (torchrun is `python -m torch.distributed.run`), HOST = 127.0.0.1."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint=127.0.0.1:{port}",
        f"--rdzv_id={job}",
        str(STAGES_DIR / f"{stage}.py"),
        *stage_args,
    ]


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["speed_6_ddp", "memory_4_fsdp"])
def test_two_torchrun_nodes_train_as_one_process_on_the_combined_batch(stage, tmp_path, char_data):
    common = ["--profile", "smoke", "--device", "cpu", "--data-dir", str(char_data), "--wandb", "disabled"]
    nodes_out, single_out = tmp_path / "nodes", tmp_path / "single"
    env, marker = marked_env(HOOK_DROPOUT="0", HOOK_SAVE_PARAMS=str(tmp_path / "nodes.pt"))
    cmd = node_command(stage, free_port(), f"test-{uuid.uuid4().hex[:8]}", *common, "--out", str(nodes_out))
    logs = [tmp_path / f"node{i}.log" for i in range(2)]
    with open(logs[0], "w") as log0:  # the first node in the background, the second in the foreground
        first = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log0, stderr=subprocess.STDOUT)
        try:
            assert run_marked(cmd, env, marker, logs[1]) == 0, logs[1].read_text()[-3000:]
            assert first.wait(timeout=120) == 0, logs[0].read_text()[-3000:]
        finally:
            if first.poll() is None:
                first.kill()
    assert_nothing_left(marker)

    # one record and one profiler trace, both from rank 0
    assert sorted(p.name for p in nodes_out.iterdir()) == [f"{stage}.json", f"{stage}.trace.json.gz"]
    record = json.loads((nodes_out / f"{stage}.json").read_text())
    assert record["status"] == "ok" and not record_problems(record)
    assert record["device"]["count"] == 2 and record["config"]["nproc"] == 2

    # the parent stage (the same settings without the process group) in one process, on both ranks' batch
    combined = 2 * stage_config(stage, "smoke").batch_size
    env, marker = marked_env(HOOK_DROPOUT="0", HOOK_SAVE_PARAMS=str(tmp_path / "single.pt"))
    single = [
        sys.executable,
        str(STAGES_DIR / f"{parent_of(stage)}.py"),
        *common,
        "--batch-size",
        str(combined),
        "--out",
        str(single_out),
    ]
    assert run_marked(single, env, marker, tmp_path / "single.log") == 0, (tmp_path / "single.log").read_text()
    single_record = json.loads((single_out / f"{parent_of(stage)}.json").read_text())
    assert single_record["metrics"]["steps_per_repeat"] == record["metrics"]["steps_per_repeat"]

    nodes, one = torch.load(tmp_path / "nodes.pt"), torch.load(tmp_path / "single.pt")
    assert nodes.keys() == one.keys()
    diffs = torch.cat([(nodes[k] - one[k]).abs().flatten() for k in one])
    lr = record["config"]["lr"]
    share, median = (diffs > APART * lr).double().mean().item(), diffs.median().item()
    print(
        f"\n{stage} on 2 nodes vs one process, {diffs.numel():,} parameters: {100 * share:.2f}% more than "
        f"lr/10 apart, median |diff| {median:.2g}, max {diffs.max().item():.2g} (lr {lr:g})"
    )
    assert share < MAX_SHARE_APART and median < MAX_MEDIAN * lr

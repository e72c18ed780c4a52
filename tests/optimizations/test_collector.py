"""The collector kept off the set-up's objects (gpt/optimizations/collector.py, speedrun_19): same arithmetic.

The same losses bit for bit as the parent, every object alive after set-up frozen, and the garbage the steps make
still collected by the collector's own automatic passes. Each run in a process of its own: a freeze is the process's
for the rest of its life."""

import json
import subprocess
import sys

import pytest
from conftest import REPO

from gpt import optimizations
from gpt.errors import UserError
from gpt.ladder import stage_config

# A stage's own code path (train.prepare, then its steps) on the tests' excerpt; prints the losses (exact, as hex),
# how many objects are frozen and how many are still tracked after set-up, and whether a reference cycle made after
# set-up was freed by the collector's automatic passes alone (the allocations below trigger them; no gc.collect()).
RUN = """
import gc, json, sys, weakref, torch
from gpt import train
from gpt.ladder import stage_config
cfg = stage_config(sys.argv[2], "cpu", True, data_dir=sys.argv[1], device="cpu")
trainer = train.prepare(cfg, torch.device("cpu"), 4, "test")
trainer.progress.disable = True
frozen, tracked = gc.get_freeze_count(), len(gc.get_objects())
losses = trainer.run(4)

class Node:
    pass

node = Node()
node.self = node  # a cycle: reference counting alone never frees it
alive = weakref.ref(node)
del node
keep = [[i] for i in range(100_000)]  # container allocations: the collector's automatic passes run many times
print(json.dumps({"losses": [l.item().hex() for l in losses], "frozen": frozen, "tracked": tracked,
                  "cycle_freed": alive() is None}))
"""


def _run(char_data, stage: str) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", RUN, str(char_data), stage], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_frozen_collector_trains_bit_for_bit_and_still_frees_the_steps_garbage(char_data):
    """speedrun_19 trains its parent's losses to the last bit, freezes what set-up left, and still collects cycles.

    Frozen: more objects than the import of torch alone leaves tracked (~167,000, docs), and almost none tracked after
    set-up (the tqdm bar's and the few made after the last freeze). Seen failing on a version whose stage also scaled
    AdamW's rate by 1.01 (the losses differ from the second step) and on one that called gc.disable() instead of
    gc.freeze() (the cycle made after set-up is never freed)."""
    parent, child = _run(char_data, "speedrun_18_batched_muon"), _run(char_data, "speedrun_19_gc_freeze")
    assert child["losses"] == parent["losses"]
    assert parent["cycle_freed"] and child["cycle_freed"]
    assert parent["frozen"] == 0 and child["frozen"] > 100_000 and child["tracked"] < 1_000, child


def test_the_setting_takes_only_a_bool_and_is_the_stages_one_change():
    parent, cfg = stage_config("speedrun_18_batched_muon", "cpu"), stage_config("speedrun_19_gc_freeze", "cpu")
    (opt,) = optimizations.changed(parent.to_dict(), cfg.to_dict())
    assert opt.fields == ("gc_freeze",) and cfg.gc_freeze and not parent.gc_freeze
    cfg.gc_freeze = 1
    with pytest.raises(UserError, match="gc_freeze must be true or false"):
        optimizations.validate(cfg)

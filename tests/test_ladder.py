"""The ladders' structure: one script per stage, each one change away from its parent, and the CLI's edges."""

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO

from gpt import optimizations
from gpt.config import PRESETS
from gpt.errors import UserError
from gpt.ladder import (
    LADDERS,
    STAGE_FILE,
    STAGES_DIR,
    all_stages,
    declaration,
    ladder_of,
    lineage,
    load_stage,
    parent_of,
    stage_config,
    stages_of,
    trains_to_a_loss_only,
)
from gpt.settings_profiles import PROFILES
from gpt.stage import EXIT_SKIPPED

ALL_STAGES = all_stages()
# The stages whose one change switches on two or more optimizations, and why (every other stage changes the fields of
# at most one: optimizations.changed(parent, stage), read from the configs, so a new stage adds nothing here).
BUNDLES = {
    "fast_1_pretokenized": "batches gathered on the device need no DataLoader workers",
    "fast_2_bf16": "bf16 without a GradScaler and TF32: the two settings of one precision",
    "speedrun_1_systems": "the systems ladder's changes at once, before the speedrun's training changes",
}
DOCUMENTED = ("speed", "memory")  # the book's ladders; the others go beyond it (no documented figures)


def test_every_stage_has_a_script_and_every_script_a_stage():
    assert sorted(p.stem for p in STAGES_DIR.glob("*.py")) == sorted(ALL_STAGES)
    assert len(ALL_STAGES) >= len(LADDERS)


def test_every_stage_file_belongs_to_a_ladder_and_its_numbers_run_without_a_gap():
    """Every stage file belongs to a ladder, and a ladder's numbers run without a gap.

    A ladder's order is its scripts' numbers: stages/<ladder>_<n>_<name>.py, from 0 for a ladder of its own (its
    baseline), from 1 for one that starts from another ladder's stage; no number twice, none skipped."""
    for path in STAGES_DIR.glob("*.py"):
        m = STAGE_FILE.fullmatch(path.stem)
        assert m and m["ladder"] in LADDERS, path.name
    for name, ladder in LADDERS.items():
        numbers = [int(STAGE_FILE.fullmatch(s)["n"]) for s in ladder.stages]
        first = 1 if ladder.starts_from else 0
        assert numbers == list(range(first, first + len(numbers))), name
        assert ladder.starts_from is None or ladder_of(ladder.starts_from) != name


def test_the_ladders_order():
    """The order the docs and the report show (read from the file names: a renamed script must not reorder them)."""
    assert list(LADDERS) == ["speed", "fast", "memory", "lean", "speedrun"]
    assert stages_of("speed")[::3] == ["speed_0_baseline", "speed_3_non_blocking", "speed_6_ddp"]
    assert stages_of("lean") == ["lean_1_fsdp_bf16", "lean_2_chunked_loss", "lean_3_cpu_offload"]
    assert [parent_of(s) for s in ("fast_1_pretokenized", "lean_1_fsdp_bf16", "speedrun_1_systems")] == [
        "speed_5_amp",
        "memory_4_fsdp",
        "speed_0_baseline",
    ]


def test_every_ladder_says_what_it_lowers_and_whether_it_trains_to_a_loss():
    """The report builds a time table or a memory table for a ladder from its goal."""
    assert {ladder.goal for ladder in LADDERS.values()} == {"time", "memory"}
    assert {name: ladder.to_a_loss for name, ladder in LADDERS.items()} == {
        "speed": "also",
        "fast": "also",
        "memory": "never",
        "lean": "never",
        "speedrun": "only",
    }


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_a_stages_declaration_is_what_its_script_holds(stage):
    """The declaration is read from the file (ast), the module's attributes by running it: the same."""
    declared, module = declaration(stage), load_stage(stage)
    assert (declared.name, declared.ladder, declared.parent) == (stage, ladder_of(stage), parent_of(stage))
    assert declared.doc == module.__doc__ and declared.change == module.CHANGE
    assert declared.reference == module.REFERENCE and declared.kind == getattr(module, "KIND", None)


def test_reading_the_declarations_runs_no_stage_and_loading_one_imports_nothing_from_gpt():
    """Reading the stages' declarations runs no stage, and loading a stage script imports nothing from gpt.

    The report and the planner read every stage's declaration without importing gpt.stage (once every stage script
    imported it, which imported gpt.ladder, which loaded the scripts: a hidden cycle); loading a stage script for its
    change() imports no module of gpt at all."""
    script = (
        "import sys\n"
        "from gpt.ladder import all_stages, declaration\n"
        "declared = [declaration(s) for s in all_stages()]\n"
        "assert declared and 'gpt.stage' not in sys.modules, sorted(sys.modules)\n"
        "assert not any(m.startswith('stages.') for m in sys.modules)\n"
        "import importlib.util\n"
        "for name in [m for m in sys.modules if m == 'gpt' or m.startswith('gpt.')]:\n"
        "    del sys.modules[name]\n"
        "for stage in all_stages():\n"
        "    spec = importlib.util.spec_from_file_location(stage, f'stages/{stage}.py')\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "assert not [m for m in sys.modules if m == 'gpt' or m.startswith('gpt.')]\n"
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("stage", ALL_STAGES)
def test_stage_script_documents_its_parent_change_and_reference(stage):
    declared = declaration(stage)
    parent = parent_of(stage)
    assert f"Parent: {parent or 'none'}." in declared.doc
    assert declared.change
    if ladder_of(stage) in DOCUMENTED:
        assert declared.reference  # every documented stage has its documented figure
    elif declared.reference:  # an anchor from elsewhere: its figure and the one it improves on
        assert set(declared.reference) == {"ms_per_step", "parent_ms_per_step"}
    else:
        assert "No anchor figure" in declared.doc
    # the figure in the code is the one the docstring cites, in its "Parent: ... Reference/Anchor" paragraph, as a
    # whole number (not a number elsewhere in the docstring, nor a prefix of another one)
    cited = declared.doc.split("Parent: ", 1)[1].split("\n\n", 1)[0]
    for value in declared.reference.values():
        assert re.search(rf"(?<![\d.]){re.escape(str(value))}(?![\d]|\.\d)", cited), (value, cited)


def test_beyond_the_book_ladders_continue_from_a_documented_stage():
    assert parent_of("fast_1_pretokenized") == "speed_5_amp" and parent_of("lean_1_fsdp_bf16") == "memory_4_fsdp"
    assert lineage("fast_2_bf16")[:7] == stages_of("speed")[:6] + ["fast_1_pretokenized"]
    fast, amp = stage_config("fast_1_pretokenized", "cpu"), stage_config("speed_5_amp", "cpu")
    assert fast.amp and fast.compile and fast.batch_size == amp.batch_size and fast.distributed is None
    lean = stage_config("lean_1_fsdp_bf16", "cpu")
    assert lean.distributed == "fsdp" and not lean.optimizer_foreach and lean.activation_checkpointing


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("stage", [s for s in ALL_STAGES if parent_of(s)])
def test_each_stage_makes_one_change(profile, stage):
    """Each stage makes one change: the fields of one optimization, or a training change of the speedrun.

    A stage changes something, the fields of one optimization (a declared bundle: more), and the run's own settings
    (budget, learning rate: fields no optimization owns) only as a training change of the speedrun, the model's shape
    (its depth) only as a model change."""
    on_task = trains_to_a_loss_only(stage)  # speed_0 as the speedrun's parent: on the speedrun's task
    cfg, before = stage_config(stage, profile), stage_config(parent_of(stage), profile, speedrun_task=on_task)
    before.stop_at_target = trains_to_a_loss_only(stage)  # the speedrun ladder's rule (gpt/ladder.py), no stage's
    after, parent = cfg.to_dict(), before.to_dict()
    changed_fields = [f for f in after if after[f] != parent[f]]
    assert changed_fields
    assert len(optimizations.changed(parent, after)) <= 1 or stage in BUNDLES, stage
    kind, shape = declaration(stage).kind, set(PRESETS["gpt-mini"])  # a model change may set the shape (speedrun_23)
    assert kind == "training" or all(optimizations.owner(f) or kind == "model" and f in shape for f in changed_fields)


def test_stage_references_match_the_documented_ladder():
    ladder_json = REPO.parent / "shared" / "reference" / "ladder.json"
    if not ladder_json.exists():
        pytest.skip("shared/reference/ladder.json is not beside this checkout")
    documented = json.loads(ladder_json.read_text())
    for ladder in DOCUMENTED:
        for stage, doc in zip(stages_of(ladder), documented[ladder]["stages"], strict=True):
            ref = declaration(stage).reference
            assert ref["seconds"] == doc["seconds"]
            if "peak_mib" in doc:
                assert ref["peak_mib"] == doc["peak_mib"]


def test_reference_profile_is_the_documented_setup():
    speed, memory = stage_config("speed_0_baseline", "reference"), stage_config("memory_0_baseline", "reference")
    assert (speed.batch_size, speed.block_size, speed.samples, speed.repeats, speed.warmup_iters) == (
        32,
        128,
        10240,
        5,
        10,
    )
    assert stage_config("speed_1_batch_size", "reference").batch_size == 256
    assert (memory.preset, memory.batch_size, memory.samples) == ("gpt2-large", 32, 1024)
    assert stage_config("memory_1_grad_accum", "reference").micro_batch_size == 16
    assert memory.data_dir.endswith("shakespeare_char") and speed.attention == "naive" and speed.dropout == 0.1


def test_unknown_stage_is_a_user_error():
    with pytest.raises(UserError, match="unknown stage"):
        stage_config("speed_9_magic", "cpu")


def run_script(stage, *args):
    return subprocess.run(
        [sys.executable, str(STAGES_DIR / f"{stage}.py"), *args], capture_output=True, text=True, timeout=120
    )


def test_help_documents_the_common_flags():
    r = run_script("speed_1_batch_size", "--help")
    assert r.returncode == 0
    for flag in ("--profile", "--device", "--out", "--wandb", "--samples", "--repeats", "--preset"):
        assert flag in r.stdout
    assert "Parent: speed_0_baseline" in r.stdout  # the docstring is the help text


def test_distributed_stage_that_cannot_run_is_skipped_with_one_line(tmp_path):
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine can run 2 GPU processes")
    r = run_script(
        "speed_6_ddp", "--device", "cuda", "--profile", "smoke", "--out", str(tmp_path), "--wandb", "disabled"
    )
    assert r.returncode == EXIT_SKIPPED
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"error: speed_6_ddp cannot run here: needs 2 GPUs, found \d", lines[0])
    record = json.loads((tmp_path / "speed_6_ddp.json").read_text())
    assert record["status"] == "skipped" and "needs 2 GPUs" in record["reason"]


def test_dropout_and_loss_impl_flags_reach_the_config(tmp_path, char_data):
    """nanoGPT's bench.py trains without dropout: --dropout sets it (bad values: one line, exit 2)."""
    r = run_script(
        "speed_0_baseline",
        "--profile",
        "smoke",
        "--device",
        "cpu",
        "--data-dir",
        str(char_data),
        "--out",
        str(tmp_path),
        "--wandb",
        "disabled",
        "--dropout",
        "0",
        "--no-profiler",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads((tmp_path / "speed_0_baseline.json").read_text())
    assert record["config"]["dropout"] == 0.0 == record["model"]["dropout"]
    assert record["choices"]["loss_impl"] is None  # the full loss
    r = run_script("speed_0_baseline", "--profile", "smoke", "--dropout", "1.5", "--out", str(tmp_path))
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["error: dropout must be in [0, 1), got 1.5"]
    assert stage_config("fast_6_chunked_loss", "smoke", loss_impl="liger").loss_impl == "liger"

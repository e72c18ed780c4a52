"""W&B logging of a stage record: an offline run holds the config, the per-step curves and the summary.

A W&B failure is one warning line, never an exception. Offline, no network, a few seconds."""

import json
import struct

import pytest
from test_report import fake_record

from gpt import wandb_log


def read_offline_run(run_file):
    """The records of an offline run's .wandb file.

    W&B's append-only log: a 7-byte header, then LevelDB-style 32 KiB blocks of chunks, each with a 7-byte header:
    crc32, length, type."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, pos, chunks, records = run_file.read_bytes(), 32768, 7, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunks += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


@pytest.fixture()
def wandb_dir(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install wandb)")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("GPT_LADDER_GROUP", "test-group")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    return tmp_path


def test_offline_run_has_config_curves_summary_and_trace(wandb_dir):
    record = fake_record("memory_1_grad_accum", seconds=2.5, peak=64.0)
    trace = wandb_dir / "records" / "memory_1_grad_accum.trace.json.gz"
    trace.parent.mkdir()
    trace.write_bytes(b"\x1f\x8b a trace")
    wandb_log.log_run(record, mode="offline", files=[trace])
    trace.write_bytes(b"a rerun's trace")  # replaced after logging: the run keeps the one it was given

    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")  # W&B writes into $WANDB_DIR/wandb/
    records = read_offline_run(run_file)
    (run,) = [r.run for r in records if r.HasField("run")]
    assert (run.project, run.run_group, run.job_type, run.display_name) == (
        "gpt-ladder",
        "test-group",
        "memory",
        "memory_1_grad_accum",
    )
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["grad_accum_steps"] == 2 and config["model"]["params"] == 1000
    assert config["choices"]["amp_dtype"] == "float32" and config["device"]["name"] == "Test CPU"

    summary = {}
    for r in records:
        if r.HasField("summary"):
            for item in r.summary.update:
                summary["/".join(item.nested_key) or item.key] = json.loads(item.value_json)
    m = record["metrics"]
    assert summary["seconds_mean"] == 2.5 and summary["peak_memory_mib"] == 64.0
    assert summary["tokens_per_s"] == pytest.approx(m["tokens_per_s"])
    assert summary["memory_breakdown_mib/activations"] == 32.0 and summary["status"] == "ok"
    assert summary["time_breakdown_pct/backward"] == 45.0 and summary["profiler/steps"] == 2
    (attached,) = wandb_dir.glob("wandb/offline-run-*/files/memory_1_grad_accum.trace.json.gz")
    assert attached.read_bytes() == b"\x1f\x8b a trace"

    history = [
        {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.HasField("history")
    ]
    steps = [h for h in history if "train/loss" in h]
    assert [h["train/loss"] for h in steps] == pytest.approx(m["losses"])
    cfg = record["config"]
    assert steps[0]["train/tokens_per_s"] == pytest.approx(cfg["batch_size"] * cfg["block_size"] / m["step_times_s"][0])
    assert [h["memory/live_mib"] for h in history if "memory/live_mib" in h] == pytest.approx(m["memory_timeline_mib"])


def test_wandb_failure_is_one_warning_line(wandb_dir, monkeypatch, capsys):
    import wandb

    def broken(*args, **kwargs):
        raise OSError("disk full\nmore detail")

    monkeypatch.setattr(wandb, "init", broken)
    wandb_log.log_run(fake_record("speed_0_baseline"), mode="offline")  # does not raise
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "warning: W&B logging of speed_0_baseline failed (OSError: disk full); the JSON record is unaffected"
    ]


def test_disabled_never_touches_wandb(wandb_dir, monkeypatch):
    import wandb

    monkeypatch.setattr(wandb, "init", lambda *a, **k: pytest.fail("wandb.init called"))
    wandb_log.log_run(fake_record("speed_0_baseline"), mode="disabled")
    assert not (wandb_dir / "wandb").exists()


def test_missing_wandb_is_one_warning_line(monkeypatch, capsys):
    """A machine without wandb (a GPU image, say) still runs every stage: one line says what was not logged."""
    monkeypatch.setattr(wandb_log, "wandb_installed", lambda: False)
    wandb_log.log_run(fake_record("speed_0_baseline"), mode="offline")
    assert capsys.readouterr().err.strip().splitlines() == [
        "warning: wandb is not installed, so speed_0_baseline is not logged to W&B (pip install wandb, or "
        "--wandb disabled); the JSON record is unaffected"
    ]


def logged_curve(record: dict, wandb_dir) -> list[dict]:
    """The curve rows an offline W&B run of `record` holds (those with a validation loss), read back from its file."""
    wandb_log.log_run(record, mode="offline")
    (run_file,) = wandb_dir.glob("wandb/offline-run-*/run-*.wandb")
    history = [
        {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
        for r in read_offline_run(run_file)
        if r.HasField("history")
    ]
    return [h for h in history if "val/loss" in h]


def test_a_muon_curve_logs_adamws_learning_rate_and_muons_beside_it(wandb_dir):
    """A Muon stage's curve logs AdamW's learning rate as `lr` and Muon's as `muon_lr` beside it.

    W&B gets both from a curve point, each under its own name (curve/lr the same in every stage), and no Muon rate where
    the point has none."""
    points = [
        {"step": 0, "tokens": 0, "seconds": 0.0, "train_loss": None, "val_loss": 4.0, "lr": None, "muon_lr": None},
        {"step": 2, "tokens": 256, "seconds": 1.0, "train_loss": 3.9, "val_loss": 3.8, "lr": 1e-3, "muon_lr": 0.03},
    ]
    record = {
        **fake_record("speedrun_3_muon"),
        "mode": "time_to_loss",
        "seed": None,
        "metrics": {"curve": points, "steps": 2, "tokens": 256},
    }
    rows = logged_curve(record, wandb_dir)
    assert [(h.get("curve/lr"), h.get("curve/muon_lr")) for h in rows] == [(None, None), (1e-3, 0.03)]


def test_a_curve_logs_the_wall_clock_beside_the_training_seconds(wandb_dir):
    """A curve logs each evaluation's process wall clock beside the training seconds.

    The process wall clock (`wall_s`) is W&B's curve/wall_seconds, so a speedrun panel switches its x-axis between
    training seconds and the wall clock a user waits; a point without it (an older record) logs none."""
    points = [
        {"step": 0, "tokens": 0, "seconds": 0.0, "wall_s": 12.5, "train_loss": None, "val_loss": 4.0, "lr": None},
        {"step": 2, "tokens": 256, "seconds": 1.0, "train_loss": 3.9, "val_loss": 3.8, "lr": 1e-3},
    ]
    record = {
        **fake_record("speedrun_6_bigram"),
        "mode": "time_to_loss",
        "seed": None,
        "metrics": {"curve": points, "steps": 2, "tokens": 256},
    }
    rows = logged_curve(record, wandb_dir)
    assert [(h.get("curve/seconds"), h.get("curve/wall_seconds")) for h in rows] == [(0.0, 12.5), (1.0, None)]

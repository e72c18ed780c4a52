"""The committed records (gpt/committed_records.py) hold a default run's JSON files and nothing else.

They land in records/<profile>-<device>/, replacing an earlier run's, so that results.md can be regenerated from a
clone."""

from gpt.committed_records import json_files, publish


def test_publish_copies_the_json_records_only_and_replaces_an_earlier_runs(tmp_path):
    runs, dest = tmp_path / "runs", tmp_path / "records"
    (runs / "time_to_loss").mkdir(parents=True)
    kept = [
        "machine.json",
        "memory_fit.json",
        "speed_0_baseline.json",
        "time_to_loss/speed_0_baseline.json",
        "time_to_loss/speed_0_baseline.seed1.json",
    ]
    left = [
        "speed_0_baseline.log",
        "speed_0_baseline.trace.json.gz",
        "speed_0_baseline.memory.pickle",
        ".run_all.lock",
        "time_to_loss/speed_0_baseline.log",
    ]
    for name in kept + left:
        (runs / name).write_text(name)
    dest.mkdir()
    (dest / "speed_6_ddp.json").write_text("an earlier run's record")  # not in this run: must not stay
    (dest / "note.md").write_text("provenance")  # the folder's own note stays
    publish(runs, dest)
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == sorted(kept + ["note.md"])
    seed = "time_to_loss/speed_0_baseline.seed1.json"
    assert (dest / seed).read_text() == seed
    assert [p.name for p in json_files(dest)] == [p.name for p in json_files(runs)]

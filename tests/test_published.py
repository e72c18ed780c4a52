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


def test_a_speedrun_section_forgets_a_former_last_stages_other_seeds(tmp_path):
    """Once a stage is added, the former last stage's extra seeds are removed from the run's folder before it runs.

    They are an earlier run's: published beside this run's one seed of that stage, the report read three seeds, two of
    them another commit's (the run of 51daa66, which kept `speedrun_20`'s seeds 3408 and 3409 of the run of 48c22d9).
    The last stage's own seeds, and every stage's record of the profile's seed, stay: this run writes them; so do
    speed_0's seeds, which the reference profile trains in the same folder. Seen failing with no record removed."""
    from gpt.records import record_path
    from gpt.run_all import forget_other_seeds, loss_jobs

    jobs = loss_jobs(["speedrun_20_untied_head"], tmp_path) + loss_jobs(
        ["speedrun_21_plain_optimizer"], tmp_path, [None, 3408, 3409]
    )
    stale = [record_path(tmp_path, "speedrun_20_untied_head", seed) for seed in (3408, 3409)]
    baseline = record_path(tmp_path, "speed_0_baseline", 3408)  # another section's job: not these jobs' to judge
    for path in [*stale, baseline, *(job.record for job in jobs)]:
        path.write_text("{}")
    forget_other_seeds(tmp_path, jobs)
    assert sorted(tmp_path.glob("*.json")) == sorted([baseline, *(job.record for job in jobs)])

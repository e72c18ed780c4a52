"""The test suite's timing record (gpt/suite_time.py) and the README's sentence made from it."""

import json

from gpt import suite_time
from gpt.devices import cpu_kind, same_cpu_kind
from gpt.report import readme

EPYC = "model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"


def test_the_cpu_is_named_by_its_model_and_the_matrix_units_it_has():
    assert cpu_kind(EPYC) == "AMD EPYC with AVX512-BF16"
    assert cpu_kind(EPYC.replace(" avx512f avx512_bf16", "")) == "AMD EPYC without AVX-512"
    xeon = "model name\t: Intel(R) Xeon(R)  Platinum\nflags\t\t: avx512f avx512_bf16 amx_tile\n"
    assert cpu_kind(xeon) == "Intel(R) Xeon(R) Platinum with AMX"


def test_the_cpu_kind_names_x86s_family_and_model_and_older_records_match_any_generation():
    """One model name and one set of units spans generations (Zen 4 and Zen 5 EPYCs both "with AVX512-BF16").

    Seen failing with `strict` ignored (the README then compared a Zen 5 first run with a Zen 4 one)."""
    zen5 = EPYC + "cpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
    assert cpu_kind(zen5) == "AMD EPYC with AVX512-BF16 (family 26, model 2)"
    zen4 = cpu_kind(zen5.replace("26", "25").replace(": 2\n", ": 17\n"))
    assert zen4 == "AMD EPYC with AVX512-BF16 (family 25, model 17)"
    old = cpu_kind(EPYC)  # a record made before the generation was named
    assert same_cpu_kind(cpu_kind(zen5), cpu_kind(zen5), strict=True)
    assert not same_cpu_kind(cpu_kind(zen5), zen4)
    assert same_cpu_kind(old, zen4) and same_cpu_kind(zen4, old) and same_cpu_kind(old, old)
    assert not same_cpu_kind(old, zen4, strict=True) and not same_cpu_kind(old, old, strict=True)
    assert not same_cpu_kind(old, "AMD EPYC without AVX-512 (family 25, model 1)") and not same_cpu_kind(None, None)


def test_pytests_closing_line_gives_the_tally_and_its_seconds():
    out = "....\n===== 1 failed, 782 passed, 50 skipped, 2 warnings in 308.12s (0:05:08) =====\n"
    tally = {"failed": 1, "passed": 782, "skipped": 50, "warnings": 2, "pytest_s": 308.1}
    assert suite_time.closing_counts(out) == tally
    assert suite_time.closing_counts("== 3 failed in 9.0s ==\n" + out) == tally  # the last closing line counts
    assert suite_time.closing_counts("Traceback ...\n") == {}


def test_the_readme_sentence_gives_each_cpus_newest_timing_and_points_to_the_rest(tmp_path, monkeypatch):
    """Newest CPU kind first; each kind's newest entry in full; the older ones counted, left to the record."""
    entry = {"cores": 2, "command": "time .ci/run", "date": "2026-11-28"}
    runs = [
        {**entry, "commit": "aaaaaaa", "cpu": "B", "wall_s": 700, "note": "one test at a time"},
        {**entry, "commit": "ccccccc", "cpu": "B", "wall_s": 542, "pytest_s": 440},
        {**entry, "commit": "bbbbbbb", "cpu": "A", "wall_s": 361, "pytest_s": 308, "passed": 782, "skipped": 50},
    ]
    (tmp_path / "test_suite.json").write_text(json.dumps({"runs": runs}))
    monkeypatch.setattr(suite_time, "RECORD", tmp_path / "test_suite.json")
    assert readme.test_suite_time() == (
        "on a 2-core A, 6 min 1 s in all, 5 min 8 s of them pytest's, at commit bbbbbbb (2026-11-28; 782 passed, "
        "50 skipped); "
        "on a 2-core B, 9 min 2 s in all, 7 min 20 s of them pytest's, at commit ccccccc (2026-11-28) "
        "(1 earlier timing, each with its commit: `records/test_suite.json`)"
    )


def test_a_timing_is_added_to_the_records_runs_keeping_the_earlier_ones(tmp_path):
    from gpt.records import append_run, read_record

    append_run(tmp_path / "t.json", {"commit": "a"})
    append_run(tmp_path / "t.json", {"commit": "b"})
    assert read_record(tmp_path / "t.json") == {"runs": [{"commit": "a"}, {"commit": "b"}]}

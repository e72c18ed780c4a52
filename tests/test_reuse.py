"""gpt/reuse.py: a machine-independent record is reused only while the code it ran, torch and its key are unchanged."""

import sys
import types

import pytest
import torch

from gpt import reuse


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository of one imported module (gpt/thing.py) and one stage script, the only ones provenance can see."""
    (tmp_path / "gpt").mkdir()
    (tmp_path / "stages").mkdir()
    (tmp_path / "gpt" / "thing.py").write_text("X = 1\n")
    (tmp_path / "stages" / "stage_a.py").write_text("CHANGE = 'a'\n")
    (tmp_path / "notes.py").write_text("never imported\n")
    monkeypatch.setattr(reuse, "REPO_ROOT", tmp_path)
    module = types.ModuleType("gpt_thing_for_test")
    module.__file__ = str(tmp_path / "gpt" / "thing.py")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return tmp_path


def test_provenance_names_the_imported_sources_and_every_stage_script(repo):
    prov = reuse.provenance({"k": 1})
    assert prov["files"] == ["gpt/thing.py", "stages/stage_a.py"]  # not the file no module came from
    assert prov["torch"] == torch.__version__ and prov["key"] == {"k": 1}
    assert reuse.still_valid({"provenance": prov}, {"k": 1})


@pytest.mark.parametrize(
    "change", ["edit a module", "edit a stage", "remove a file", "other key", "other torch", "no provenance"]
)
def test_a_record_from_other_code_torch_or_key_is_not_reused(repo, change, monkeypatch):
    record = {"provenance": reuse.provenance({"k": 1})}
    key = {"k": 1}
    if change == "edit a module":
        (repo / "gpt" / "thing.py").write_text("X = 2\n")
    elif change == "edit a stage":
        (repo / "stages" / "stage_a.py").write_text("CHANGE = 'b'\n")
    elif change == "remove a file":
        (repo / "stages" / "stage_a.py").unlink()
    elif change == "other key":
        key = {"k": 2}
    elif change == "other torch":
        monkeypatch.setattr(torch, "__version__", "0.0.1")
    else:
        record = {}
    assert not reuse.still_valid(record, key)


def test_reuse_record_copies_a_valid_record_and_says_so(repo, tmp_path, capsys):
    source, dest = tmp_path / "src.json", tmp_path / "out" / "dest.json"
    assert reuse.reuse_record(source, {"k": 1}, dest) is None  # nothing there yet
    assert "no record there" in capsys.readouterr().out
    reuse.write_record(source, {"figure": 3, "provenance": reuse.provenance({"k": 1})})
    got = reuse.reuse_record(source, {"k": 1}, dest)
    assert got["figure"] == 3 and got["reused_from"] == "src.json"  # inside the repository: from its root
    assert reuse.read_record(dest) == got
    assert "reused" in capsys.readouterr().out and "does not depend on the machine" in reuse.reused_note(got)
    assert reuse.reuse_record(source, {"k": 2}, dest) is None
    assert "computing it" in capsys.readouterr().out

"""gpt/record_reuse.py: a machine-independent record is reused only while its code, torch and its key are unchanged."""

import ast
import io
import json
import shutil
import sys
import tokenize
import types

import pytest
import torch

from gpt import record_reuse


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository of one imported module (gpt/thing.py) and one stage script, the only ones provenance can see."""
    (tmp_path / "gpt").mkdir()
    (tmp_path / "stages").mkdir()
    (tmp_path / "gpt" / "thing.py").write_text("X = 1\n")
    (tmp_path / "stages" / "stage_a.py").write_text("CHANGE = 'a'\n")
    (tmp_path / "notes.py").write_text("never imported\n")
    monkeypatch.setattr(record_reuse, "REPO_ROOT", tmp_path)
    module = types.ModuleType("gpt_thing_for_test")
    module.__file__ = str(tmp_path / "gpt" / "thing.py")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return tmp_path


def test_provenance_names_the_imported_sources_and_every_stage_script(repo):
    prov = record_reuse.provenance({"k": 1})
    assert prov["files"] == ["gpt/thing.py", "stages/stage_a.py"]  # not the file no module came from
    assert prov["torch"] == torch.__version__ and prov["key"] == {"k": 1}
    assert record_reuse.still_valid({"provenance": prov}, {"k": 1})


@pytest.mark.parametrize(
    "change",
    [
        "edit a module",
        "new import",
        "renamed variable",
        "edit a stage",
        "remove a file",
        "other key",
        "other torch",
        "no provenance",
        "byte-hashed",
    ],
)
def test_a_record_from_other_code_torch_or_key_is_not_reused(repo, change, monkeypatch):
    record = {"provenance": record_reuse.provenance({"k": 1})}
    key = {"k": 1}
    if change == "edit a module":
        (repo / "gpt" / "thing.py").write_text("X = 2\n")
    elif change == "new import":
        (repo / "gpt" / "thing.py").write_text("import os\n\nX = 1\n")
    elif change == "renamed variable":
        (repo / "gpt" / "thing.py").write_text("Y = 1\n")
    elif change == "edit a stage":
        (repo / "stages" / "stage_a.py").write_text("CHANGE = 'b'\n")
    elif change == "remove a file":
        (repo / "stages" / "stage_a.py").unlink()
    elif change == "other key":
        key = {"k": 2}
    elif change == "other torch":
        monkeypatch.setattr(torch, "__version__", "0.0.1")
    elif change == "byte-hashed":  # a provenance from before the hash rule had a name: recomputed, never compared
        del record["provenance"]["hash"]
    else:
        record = {}
    assert not record_reuse.still_valid(record, key)


def test_formatting_comments_and_docstrings_are_not_what_runs(repo):
    record = {"provenance": record_reuse.provenance({"k": 1})}
    (repo / "gpt" / "thing.py").write_text('"""A docstring, new."""\n\n# a comment\nX = (\n    1  # one\n)\n')
    assert record_reuse.still_valid(record, {"k": 1})


NOISE_SCALE = "records/cpu-cpu/speedrun/noise_scale.json"  # a committed record, computed by many files


def _edit_prose(source: str) -> str:
    """The source with its first docstring and its first comment reworded (each added where it has none)."""
    tree = ast.parse(source)
    docs = [
        node.body[0].value
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and ast.get_docstring(node, clean=False) is not None
    ]
    comments = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    lines = source.splitlines(keepends=True) or [""]
    inserts = [(0, 0, '"""An added docstring."""\n')] if not docs else []
    if docs:  # after the opening quotes, past any prefix such as r
        line, col = docs[0].lineno - 1, docs[0].col_offset
        quote = next(i for i in range(col, len(lines[line])) if lines[line][i] in "\"'")
        inserts.append(
            (line, quote + (3 if lines[line][quote] * 3 == lines[line][quote : quote + 3] else 1), "Reworded: ")
        )
    if comments:
        inserts.append((comments[0].start[0] - 1, comments[0].start[1] + 1, " reworded:"))
    else:
        lines[-1] += ("" if lines[-1].endswith("\n") or not lines[-1] else "\n") + "# an added comment\n"
    for line, col, text in sorted(inserts, reverse=True):  # from the end: an insertion moves nothing before it
        lines[line] = lines[line][:col] + text + lines[line][col:]
    return "".join(lines)


def _change_a_constant(source: str) -> str | None:
    """The source with its first decimal integer literal one larger; None if it has none."""
    lines = source.splitlines(keepends=True)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and type(node.value) is int and node.lineno == node.end_lineno:
            line = lines[node.lineno - 1]
            if line[node.col_offset : node.end_col_offset].isdigit():
                lines[node.lineno - 1] = line[: node.col_offset] + str(node.value + 1) + line[node.end_col_offset :]
                return "".join(lines)
    return None


def test_a_committed_record_survives_prose_edits_to_every_file_but_not_a_changed_constant(tmp_path, monkeypatch):
    """A scratch copy of the files the committed noise-scale record names: prose edited in each, then one constant.

    A reworded docstring and comment in every file leave the record reused; the constant makes it stale."""
    committed = json.loads((record_reuse.REPO_ROOT / NOISE_SCALE).read_text())
    files = [f for f in committed["provenance"]["files"] if (record_reuse.REPO_ROOT / f).is_file()]
    for rel in files:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record_reuse.REPO_ROOT / rel, tmp_path / rel)
    monkeypatch.setattr(record_reuse, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(record_reuse, "source_files", lambda: files)  # the record's files, not this test process's
    key = committed["provenance"]["key"]
    source = tmp_path / NOISE_SCALE
    record_reuse.write_record(source, {**committed, "provenance": record_reuse.provenance(key)})

    for rel in files:
        before = (tmp_path / rel).read_text()
        after = _edit_prose(before)
        assert after != before and ast.dump(ast.parse(after)) != ast.dump(ast.parse(before))  # the docstring
        (tmp_path / rel).write_text(after)
    assert record_reuse.reuse_record(source, key) is not None

    rel, changed = next((rel, c) for rel in files if (c := _change_a_constant((tmp_path / rel).read_text())))
    (tmp_path / rel).write_text(changed)
    assert record_reuse.reuse_record(source, key) is None


def test_reuse_record_copies_a_valid_record_and_says_so(repo, tmp_path, capsys):
    source, dest = tmp_path / "src.json", tmp_path / "out" / "dest.json"
    assert record_reuse.reuse_record(source, {"k": 1}, dest) is None  # nothing there yet
    assert "no record there" in capsys.readouterr().out
    record_reuse.write_record(source, {"figure": 3, "provenance": record_reuse.provenance({"k": 1})})
    got = record_reuse.reuse_record(source, {"k": 1}, dest)
    assert got["figure"] == 3 and got["reused_from"] == "src.json"  # inside the repository: from its root
    assert record_reuse.read_record(dest) == got
    assert "reused" in capsys.readouterr().out and "does not depend on the machine" in record_reuse.reused_note(got)
    assert record_reuse.reuse_record(source, {"k": 2}, dest) is None
    assert "computing it" in capsys.readouterr().out

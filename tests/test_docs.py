"""The README and docs/ point at things that exist.

Every relative link (and its #anchor), every `path.py:name` pointer into the code, and every code path written in
backticks. A renamed function or a moved page fails here instead of leaving a reader at a dead end."""

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
POINTER = re.compile(r"([\w./-]+\.py):([A-Za-z_][\w.]*)")
CODE_PATH = re.compile(r"`((?:gpt|stages|tests|data)/[\w./-]*\.py)`")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def defines(path: Path, dotted: str) -> bool:
    """Whether `path` defines `dotted` (a function, class or assignment; Class.member one level down)."""
    body = ast.parse(path.read_text()).body
    for name in dotted.split("."):
        found = None
        for node in body:
            names = (
                [node.name]
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                else [
                    t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)
                ]
            )
            if name in names:
                found = node
        if found is None:
            return False
        body = getattr(found, "body", [])
    return True


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    return broken


def broken_pointers(page: Path) -> list[str]:
    text, broken = page.read_text(), []
    for path, name in POINTER.findall(text):
        if not (REPO / path).is_file():
            broken.append(f"{path}:{name}: no such file")
        elif not defines(REPO / path, name):
            broken.append(f"{path}:{name}: {path} defines no {name}")
    broken += [f"{path}: no such file" for path in CODE_PATH.findall(text) if not (REPO / path).is_file()]
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_somewhere(page):
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_code_pointer_names_something_that_exists(page):
    assert broken_pointers(page) == []


def test_the_checks_see_links_and_pointers():
    """The patterns find what the pages hold (a regex that matched nothing would pass every page)."""
    text = "\n".join(p.read_text() for p in PAGES)
    assert len(LINK.findall(text)) > 20 and len(POINTER.findall(text)) > 10 and len(CODE_PATH.findall(text)) > 10


def test_every_records_folder_is_listed_in_docs_records_md():
    """docs/records.md's table lists every folder of records/, each with its device, its commit and what ran."""
    table = (
        (REPO / "docs" / "records.md").read_text().split("| folder | device | code | what ran |")[1].split("\n\n")[0]
    )
    listed = set(re.findall(r"`records/([\w.-]+)/`", table))
    assert listed == {p.name for p in (REPO / "records").iterdir() if p.is_dir()}
    assert all(re.search(r"commit [0-9a-f]{7}", row) for row in table.splitlines()[2:])

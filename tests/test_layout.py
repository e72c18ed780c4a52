"""The code's layout stays readable and portable: no import cycle among gpt's modules, no function in gpt/, data/
or stages/ longer than a screen (MAX_FUNCTION_LINES), both read from the source (ast); and every module imports
on an older torch."""
import ast
import subprocess
import sys

from conftest import REPO

MAX_FUNCTION_LINES = 80


def module_imports() -> dict[str, set[str]]:
    """gpt's modules -> the gpt modules each imports (at the top or inside a function)."""
    files = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (REPO / "gpt").rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in files:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in files}
        graph[name] = deps - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    found = set()

    def visit(node, path):
        for dep in graph.get(node, ()):
            if dep in path:
                cycle = path[path.index(dep):]
                found.add(min(tuple(cycle[i:] + cycle[:i]) for i in range(len(cycle))))
            else:
                visit(dep, path + [dep])

    for node in graph:
        visit(node, [node])
    return found


def test_no_import_cycle_in_gpt():
    graph = module_imports()
    assert {"gpt.protocol", "gpt.peak_memory", "gpt.flops", "gpt.clocks", "gpt.profiling"} <= graph.keys()
    assert cycles(graph) == set()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == {("a", "b", "c")}  # the check finds one


def test_no_function_longer_than_a_screen():
    long = []
    for folder in ("gpt", "data", "stages"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_every_module_imports_on_a_torch_without_the_chunked_loss_api():
    """torch 2.11 (the GPU machines' preinstalled torch) has no F.linear_cross_entropy and no
    torch.nn.LinearCrossEntropyOptions: nothing may need them at import (a return annotation once did, and
    every stage died at import there). Emulated here by deleting both before importing every module."""
    modules = sorted(".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
                     for p in (REPO / "gpt").rglob("*.py") if p.name != "__main__.py")
    script = ("import importlib, torch, torch.nn.functional as F\n"
              "for name in ('LinearCrossEntropyOptions',):\n    torch.nn.__dict__.pop(name, None)\n"
              "F.__dict__.pop('linear_cross_entropy', None)\n"
              f"for m in {modules!r}:\n    importlib.import_module(m)\n"
              "from gpt import chunked_loss\nprint(chunked_loss.installed('torch'))\n")
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "False" and len(modules) > 20

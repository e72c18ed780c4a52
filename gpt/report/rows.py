"""The report's rows: each stage of a run directory as a `Rung`, beside its parent, its baseline and its declaration."""

from pathlib import Path

from gpt.data import REPO_ROOT
from gpt.formatting import fmt_pct
from gpt.ladder import LADDERS, all_stages, declaration, lineage, parent_of
from gpt.peak_memory import MEMORY_PARTS
from gpt.records import peak_memory_pair, read_record, record_path

MACHINE_FILE = "machine.json"  # written by run_all (gpt/run_all.py): the machine the ladder ran on
# The parts of a memory breakdown the report shows one by one; 'other' then holds buffers and the rest.
SHOWN_MEMORY_PARTS = tuple(p for p in MEMORY_PARTS if p not in ("buffers", "other"))


def load_records(runs: Path) -> dict[str, dict]:
    """Stage name -> record, for the stages of every ladder that have a record in `runs`."""
    found = {}
    for stage in all_stages():
        record = read_record(record_path(runs, stage))
        if record is not None:
            found[stage] = record
    return found


def ok(record: dict | None) -> bool:
    return bool(record) and record.get("status") == "ok"


def pct(new: float | None, old: float | None) -> float | None:
    """Relative change in percent, None when either side is missing."""
    if new is None or not old:
        return None
    return 100 * (new / old - 1)


def comparable(a: dict | None, b: dict | None) -> bool:
    """Two finished records measured under the same profile on the same kind of device."""
    return ok(a) and ok(b) and a["profile"] == b["profile"] and a["device"]["type"] == b["device"]["type"]


class Rung:
    """One stage as the report sees it, beside its parent and its lineage's baseline.

    Its record (or None), its parent's (or the stage it continues from), and what its script declares."""

    def __init__(self, stage: str, records: dict[str, dict]):
        parent, first = parent_of(stage), lineage(stage)[0]
        self.stage, self.change, self.reference = stage, declaration(stage).change, declaration(stage).reference
        self.record = records.get(stage)
        self.parent_stage, self.baseline_stage = parent, (first if parent else None)
        self.parent = records.get(parent) if parent else None
        self.baseline = records.get(first) if parent else None
        self.parent_reference = declaration(parent).reference if parent else None
        self.baseline_reference = declaration(first).reference if parent else None

    @property
    def ok(self) -> bool:
        return ok(self.record)

    def m(self, key: str):
        return self.record["metrics"].get(key) if self.ok else None

    def vs(self, other: dict | None, key: str) -> float | None:
        """Change of metric `key` against another record, if the two are comparable.

        Peak memory is compared only as measured alike (see memory_basis)."""
        if not comparable(self.record, other):
            return None
        if key == "peak_memory_mib":
            return pct(*peak_memory_pair(self.record, other)[:2])
        return pct(self.m(key), other["metrics"].get(key))

    def memory_basis(self, other: dict | None) -> str | None:
        """How this peak memory compares with `other`'s: None (the same method), 'reserved' or 'none' (no change)."""
        if not comparable(self.record, other):
            return None
        basis = peak_memory_pair(self.record, other)[2]
        return None if basis == "same" else basis

    def memory_vs(self, other: dict | None) -> str:
        """The 'vs' cell of peak memory; marked with † when it compares max_memory_reserved (see method_notes)."""
        return fmt_pct(self.vs(other, "peak_memory_mib")) + (" †" if self.memory_basis(other) == "reserved" else "")

    def ref_vs(self, key: str, other: dict | None) -> float | None:
        return pct(self.reference.get(key), (other or {}).get(key))

    def status_text(self) -> str:
        if self.record is None:
            return "not run"
        status = self.record.get("status", "?")
        label = {"oom": "OOM"}.get(status, status)
        reason = self.record.get("reason")
        return f"**{label}**: {reason}" if reason else f"**{label}**"


def ladders_of(records: dict[str, dict]) -> dict[str, list[Rung]]:
    """The ladders that have at least one record, each as its full list of rungs (missing stages too)."""
    ladders = {}
    for name, ladder in LADDERS.items():
        if any(s in records for s in ladder.stages):
            ladders[name] = [Rung(s, records) for s in ladder.stages]
    return ladders


def samples_label(rungs: list[Rung]) -> str:
    """'N' of 'seconds per N samples': the ladder's samples per repeat, if all its runs agree."""
    counts = {r.m("samples_per_repeat") for r in rungs if r.ok}
    return f"{counts.pop():,}" if len(counts) == 1 else "N"


def display(path: Path) -> str:
    """A path relative to the repo when inside it (reports are read on other machines)."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)

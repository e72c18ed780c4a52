"""CUDA allocator snapshots: the one reader and the one writer of the format, the block-size rule, a step's replay.

The format, the block-size rule the replay applies and the categories: docs/memory-planner.md#cuda-allocator-snapshots.
"""

import bisect
import pickle
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from gpt.errors import UserError
from gpt.files import write_atomically

MiB = 2**20
UNIT = 512  # the caching allocator rounds every request up to a multiple of this (kMinBlockSize)
SMALL = 2**20  # kSmallSize: requests up to it use the small pool; a large block keeps a remainder up to it
# What a block is taken for when only its stacks tell (a snapshot from elsewhere); 'rounding' is added beside them.
STACK_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "other")
PICKLE_PROTOCOL = 4  # what _dump_snapshot writes (Python's default protocol up to 3.13)


def cuda_block_bytes(nbytes: int) -> int:
    """The caching allocator's block for a request of `nbytes`: rounded up to a multiple of 512 bytes.

    No block for nothing. Blocks can be larger still: a cached block is not split for a remainder under 1 MiB."""
    return -(-nbytes // UNIT) * UNIT


def write(path, snapshot: dict) -> Path:
    """Write a snapshot (a real step's, or the planner's simulated one) as _dump_snapshot does, atomically."""
    return write_atomically(path, pickle.dumps(snapshot, protocol=PICKLE_PROTOCOL))


# ---- reading ------------------------------------------------------------------------------------------------


class _Refused(Exception):
    pass


class _PlainData(pickle.Unpickler):
    """Builds dicts, lists, strings and numbers only: every global (a class, a function) is refused."""

    def find_class(self, module, name):
        raise _Refused(f"{module}.{name}")


def load(path) -> dict:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = _PlainData(f).load()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}") from None
    except _Refused as e:
        raise UserError(f"{path}: refused, it would load {e}: a memory snapshot holds plain data only") from None
    except Exception as e:  # malformed pickles raise many kinds of errors
        raise UserError(f"{path} is not a readable pickle ({type(e).__name__}: {e})") from None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("segments"), list)
        and isinstance(data.get("device_traces"), list)
    ):
        raise UserError(f"{path} is not a CUDA memory snapshot (it has no 'segments' and 'device_traces')")
    return data


# ---- the traced step ----------------------------------------------------------------------------------------


@dataclass
class _Block:
    requested: int
    size: int  # allocator bytes
    addr: int
    frames: list
    start: int | None  # index of its alloc event; None: allocated before the trace
    end: int | None = None  # index of its free event; None: alive at the end
    freed_by: list = field(default_factory=list)
    category: str = "other"


@dataclass
class StepLabels:
    """What a stage's own memory step knows about its blocks (gpt/peak_memory.py:StepMarks).

    `tensors`: (position, address, category), a position counting allocations since recording began; `forward`: each
    forward pass's [start, end]; `categories`: every category, in order."""

    tensors: list
    forward: list
    categories: tuple


@dataclass
class StepReport:
    device: int
    allocations: int  # alloc events in the trace
    trace_ms: float
    start_mib: float  # allocated at the start of the trace
    start_mib_by_category: dict
    params: int  # gradient bytes / 4: the parameter count of an fp32 model
    peak_mib: float
    peak_event: int  # index in device_traces[device]
    events: int
    peak_ms: float  # after the first event
    peak_where: str  # the pass and the code that allocated at the peak
    peak_mib_by_category: dict  # requests rounded to 512 bytes, plus 'rounding': the rest of the blocks
    peak_block_mib_by_category: dict  # whole blocks (what max_memory_allocated counts), adding up to peak_mib
    reallocated_large_blocks: int  # live at the peak, > 1 MiB, allocated anew every step (see gap notes)
    blocks_replayed: bool
    timeline: list = field(default_factory=list, repr=False)  # allocated bytes at the start and after each change
    end_mib: float = 0.0

    def as_dict(self) -> dict:
        def rounded2(v):
            return (
                {k: rounded2(x) for k, x in v.items()}
                if isinstance(v, dict)
                else round(v, 2)
                if isinstance(v, float)
                else v
            )

        return rounded2({k: v for k, v in self.__dict__.items() if k != "timeline"})


def analyse(snapshot: dict, device: int | None = None, labels: StepLabels | None = None) -> StepReport:
    """The traced step's allocated bytes over time, its peak, when it happens and what is alive then, by category.

    By `labels` when the step's own code gives them, else by the allocation stacks."""
    traces = snapshot["device_traces"]
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d]), default=0)
    if not 0 <= device < len(traces) or not traces[device]:
        raise UserError(
            f"the snapshot has no trace of allocations on device {device} (record one with "
            "torch.cuda.memory._record_memory_history() before the step)"
        )
    try:
        return _analyse(
            traces[device], [s for s in snapshot["segments"] if s.get("device", device) == device], device, labels
        )
    except (KeyError, TypeError, AttributeError, IndexError, StopIteration) as e:
        raise UserError(f"not a well-formed CUDA memory snapshot ({type(e).__name__}: {e})") from None


def _analyse(trace: list, segments: list, device: int, labels: StepLabels | None) -> StepReport:
    blocks, changes = _blocks(trace, segments)
    replayed = _replay_block_sizes(blocks, changes, trace, segments)
    if labels is None:
        backward_ends, gradients = _categorise(blocks, trace)
        categories = STACK_CATEGORIES
    else:
        backward_ends, gradients = _backward_ends(trace), _categorise_by_labels(blocks, changes, labels)
        categories = labels.categories
    params = sum(b.requested for b in gradients) // 4
    live, held = dict.fromkeys(categories, 0), dict.fromkeys(categories, 0)  # requests rounded | whole blocks
    total = large = 0
    for b in blocks:
        if b.start is None:
            live[b.category] += cuda_block_bytes(b.requested)
            held[b.category] += b.size
            total += b.size
            large += _reallocated_large(b)
    start, start_by, timeline = total, dict(live), [total]
    peak, peak_at, peak_by, peak_held, peak_large = total, None, dict(live), dict(held), large
    for i, b, sign in changes:
        live[b.category] += sign * cuda_block_bytes(b.requested)
        held[b.category] += sign * b.size
        total += sign * b.size
        large += sign * _reallocated_large(b)
        timeline.append(total)
        if total > peak:
            peak, peak_at, peak_by, peak_held, peak_large = total, i, dict(live), dict(held), large
    peak_by["rounding"] = peak - sum(peak_by.values())
    start_by["rounding"] = start - sum(start_by.values())
    t0 = trace[0].get("time_us", 0)
    at = peak_at if peak_at is not None else 0
    return StepReport(
        device=device,
        allocations=sum(e.get("action") == "alloc" for e in trace),
        trace_ms=(trace[-1].get("time_us", 0) - t0) / 1e3,
        start_mib=start / MiB,
        start_mib_by_category=_mib(start_by),
        params=params,
        peak_mib=peak / MiB,
        peak_event=at,
        events=len(trace),
        peak_ms=(trace[at].get("time_us", 0) - t0) / 1e3,
        peak_where=_where(trace, at, backward_ends) if peak_at is not None else "before the first event",
        peak_mib_by_category=_mib(peak_by),
        peak_block_mib_by_category=_mib(peak_held),
        reallocated_large_blocks=peak_large,
        blocks_replayed=replayed,
        timeline=timeline,
        end_mib=total / MiB,
    )


def _mib(d: dict) -> dict:
    return {k: v / MiB for k, v in d.items()}


def _reallocated_large(b: _Block) -> int:
    """Blocks the allocator hands out again every step, which could carry up to 1 MiB of unsplit remainder."""
    return int(b.size > SMALL and b.category in ("gradients", "activations", "temporaries"))


def _blocks(trace: list, segments: list) -> tuple[list[_Block], list[tuple[int, _Block, int]]]:
    """Every block the trace touches or the snapshot holds, and the trace's changes to allocated bytes.

    The changes are (event index, block, +1 or -1). Allocated bytes drop at free_requested (free_completed follows when
    the streams that used the block are done; older snapshots have a single 'free')."""
    live, pending, blocks, changes = {}, set(), [], []
    for i, e in enumerate(trace):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            b = _Block(e["size"], cuda_block_bytes(e["size"]), addr, e.get("frames") or [], start=i)
            live[addr] = b
            blocks.append(b)
            changes.append((i, b, +1))
        elif action in ("free_requested", "free") or (action == "free_completed" and addr not in pending):
            if action == "free_requested":
                pending.add(addr)
            b = live.pop(addr, None)
            if b is None:  # allocated before the trace began
                b = _Block(e["size"], cuda_block_bytes(e["size"]), addr, [], start=None)
                blocks.append(b)
            b.end, b.freed_by = i, e.get("frames") or []
            changes.append((i, b, -1))
        elif action == "free_completed":
            pending.discard(addr)
    for seg in segments:
        for sb in seg.get("blocks", []):
            if not str(sb.get("state", "")).startswith("active"):
                continue
            b = live.get(sb["address"])
            if b is not None:
                b.size = sb["size"]  # allocated in the trace and still held: the snapshot says its block
            else:
                blocks.append(
                    _Block(
                        sb.get("requested_size", sb["size"]),
                        sb["size"],
                        sb["address"],
                        sb.get("frames") or [],
                        start=None,
                    )
                )
    return blocks, changes


def _replay_block_sizes(blocks: list[_Block], changes: list, trace: list, segments: list) -> bool:
    """Sets each block's allocator size by replaying the caching allocator's split rule.

    False, leaving the sizes as they are, if the replay disagrees with the snapshot."""
    if any(str(e.get("action", "")).startswith("segment") for e in trace) or not segments:
        return False
    segs = sorted(segments, key=lambda s: s["address"])
    starts = [s["address"] for s in segs]

    def segment_of(addr):
        s = segs[max(0, bisect.bisect_right(starts, addr) - 1)]
        return s if s["address"] <= addr < s["address"] + s["total_size"] else None

    held = {s["address"]: [] for s in segs}  # segment -> sorted addresses of the blocks held in it
    size = {}  # address -> block size
    for b in blocks:
        if b.start is None:
            seg = segment_of(b.addr)
            if seg is None:
                return False
            held[seg["address"]].append(b.addr)
            size[b.addr] = b.size
    for addrs in held.values():
        addrs.sort()

    def free_range(seg, addr):
        """(start, end) of the free range around addr, between the held blocks on either side."""
        addrs = held[seg["address"]]
        j = bisect.bisect_right(addrs, addr)
        lo = addrs[j - 1] + size[addrs[j - 1]] if j else seg["address"]
        hi = addrs[j] if j < len(addrs) else seg["address"] + seg["total_size"]
        return lo, hi

    def keeps_remainder(seg, remainder):
        return remainder < UNIT if seg.get("segment_type") == "small" else remainder <= SMALL

    # A block allocated before the trace and freed during it is known by its request only. It kept a remainder
    # if the free range after it is one the allocator never leaves on its own (it splits off only larger ones),
    # or if an allocation starts further on than it ends (allocations start free ranges).
    unsure = {b.addr: b for b in blocks if b.start is None and b.end is not None}
    for b in unsure.values():
        seg = segment_of(b.addr)
        lo, hi = free_range(seg, b.addr + size[b.addr])
        if lo == b.addr + size[b.addr] and keeps_remainder(seg, hi - lo) and hi > lo:
            size[b.addr] += hi - lo
    sizes = {id(b): size[b.addr] for b in blocks if b.start is None}
    for _, b, sign in changes:
        seg = segment_of(b.addr)
        if seg is None:
            return False
        addrs = held[seg["address"]]
        if sign > 0:
            lo, hi = free_range(seg, b.addr)
            before = addrs[bisect.bisect_right(addrs, b.addr) - 1] if lo > seg["address"] else None
            if lo < b.addr and before in unsure and keeps_remainder(seg, b.addr - lo):
                size[before] += b.addr - lo
                sizes[id(unsure[before])] = size[before]
                lo = b.addr
            need = cuda_block_bytes(b.requested)
            if lo != b.addr or hi - lo < need:
                return False  # the allocator always hands out the start of a free range
            size[b.addr] = hi - lo if keeps_remainder(seg, hi - lo - need) else need
            sizes[id(b)] = size[b.addr]
            bisect.insort(addrs, b.addr)
        else:
            j = bisect.bisect_left(addrs, b.addr)
            if j == len(addrs) or addrs[j] != b.addr:
                return False
            addrs.pop(j)
    if any(b.end is None and sizes[id(b)] != b.size for b in blocks if b.start is not None):
        return False  # the replay must end with the snapshot's own blocks
    for b in blocks:
        b.size = sizes[id(b)]
    return True


# ---- categories ---------------------------------------------------------------------------------------------


def _in_backward(frames: list) -> bool:
    return any(
        "autograd::Engine" in f["name"]
        or (f["name"] in ("backward", "_engine_run_backward") and "/torch/" in f["filename"])
        for f in frames
    )


def _kind(frames: list) -> str:
    """optimizer, checkpoint, backward or other, from an allocation's stack (innermost frame first)."""
    files = [f["filename"] for f in frames]
    if any("/torch/optim/" in f for f in files):
        return "optimizer"
    if any(f.endswith("torch/utils/checkpoint.py") for f in files):
        return "checkpoint"
    return "backward" if _in_backward(frames) else "other"


def _backward_ends(trace: list) -> list[int]:
    """The event index where each backward pass ends (the autograd engine's frames stop)."""
    backward = [_in_backward(e.get("frames") or []) for e in trace]
    return [i for i in range(len(trace)) if backward[i] and (i + 1 == len(trace) or not backward[i + 1])]


def _categorise_by_labels(blocks: list[_Block], changes: list, labels: StepLabels) -> list[_Block]:
    """Sets every block's category from what the step saw (StepLabels); returns the blocks that held gradients.

    The trace is replayed to know which block held an address when a tensor was seen there."""
    seen = {}
    for position, addr, category in labels.tensors:
        seen.setdefault(position, []).append((addr, category))
    live = {b.addr: b for b in blocks if b.start is None}  # everything allocated before the trace is alive at its start
    number, known = {}, {}  # id(block) -> allocation number (0: before the trace) | category seen

    def observe(position: int):
        for addr, category in seen.get(position, ()):
            if addr in live:
                known[id(live[addr])] = category

    observe(0)
    for _, b, sign in changes:
        if sign > 0:
            number[id(b)] = len(number) + 1
            live[b.addr] = b
            observe(number[id(b)])
        else:
            live.pop(b.addr, None)
    for b in blocks:
        if id(b) in known:
            b.category = known[id(b)]
        elif b.start is None:
            b.category = "other"  # there before the step, never seen: DDP's gradient buckets, cuBLAS workspaces
        else:
            made_in_forward = any(start < number[id(b)] <= end for start, end in labels.forward if end is not None)
            b.category = "activations" if made_in_forward else "temporaries"
    return [b for b in blocks if b.category == "gradients"]


def _categorise(blocks: list[_Block], trace: list) -> tuple[list[int], list[_Block]]:
    """Sets every block's category from the stacks (docs/memory-planner.md#cuda-allocator-snapshots).

    Returns the event index where each backward pass ends and the gradients of one step: the first backward pass's, or
    else the previous step's that zero_grad freed."""
    ends = _backward_ends(trace)
    for b in blocks:
        if b.start is None:
            if b.end is not None:
                b.category = "gradients" if any(f["name"] == "zero_grad" for f in b.freed_by) else "other"
            continue
        kind = _kind(b.frames)
        if kind == "optimizer":
            b.category = "optimizer_state"
        elif kind == "backward":
            end = ends[bisect.bisect_left(ends, b.start)]
            b.category = "gradients" if b.end is None or b.end > end else "temporaries"
        else:
            b.category = "activations"
    step = [b for b in blocks if b.category == "gradients" and b.start is not None and ends and b.start <= ends[0]]
    gradients = step or [b for b in blocks if b.category == "gradients"]
    sizes, seen = Counter(b.requested for b in gradients), Counter()
    for b in sorted((b for b in blocks if b.start is None and b.end is None), key=lambda b: b.addr):
        seen[b.requested] += 1
        if b.requested not in sizes:
            b.category = "other"
        else:
            b.category = "parameters" if seen[b.requested] <= sizes[b.requested] else "optimizer_state"
    return ends, gradients


_WRAPPERS = ("torch/_dynamo/", "torch/_compile.py", "torch/utils/_contextlib.py")  # decorators' frames


def _where(trace: list, i: int, backward_ends: list[int]) -> str:
    frames = trace[i].get("frames") or []
    kind = _kind(frames)
    passes = len(backward_ends)
    done = bisect.bisect_left(backward_ends, i)
    if kind == "optimizer":
        phase = "in the optimizer step"
    elif kind == "backward":
        phase = f"in backward pass {done + 1} of {passes}"
    else:
        phase = f"in forward pass {done + 1} of {passes}" if done < passes else "after the last backward pass"
    py = [f for f in frames if f["filename"].endswith(".py") and not any(w in f["filename"] for w in _WRAPPERS)]
    user = next((f for f in py if "/torch/" not in f["filename"] and "site-packages" not in f["filename"]), None)
    site = f" at {_frame(py[0])}" if py else ""
    if user is not None and user is not py[0]:
        site += f", called from {_frame(user)}"
    return phase + site


def _frame(f: dict) -> str:
    return f"{f['name']} ({'/'.join(Path(f['filename']).parts[-2:])}:{f['line']})"

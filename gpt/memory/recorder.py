"""The planner's simulated step as a CUDA allocator snapshot, to open beside a real run's (pytorch.org/memory_viz).

`StepRecorder` places each storage the planner's tracker reports in a simulated segment as the caching allocator
would, and logs it with the Python stack of the code that made it.
"""

import bisect
import sys

from gpt.allocator_snapshot import SMALL, cuda_block_bytes

_MACHINERY = ("torch/distributed/_tools/", "gpt/peak_memory.py")  # MemTracker and its subclass: their frames and
# everything inside them (fake tensors, this recorder) are how the step is simulated, not what it runs
_BASE = 0x7F0000000000  # where the simulated segment starts (any aligned address)


def python_stack(depth: int = 2) -> list[dict]:
    """The caller's Python stack in the snapshot's frame format (innermost first), the tracking machinery left out."""
    frames, f = [], sys._getframe(depth)
    while f is not None:
        frames.append({"name": f.f_code.co_name, "filename": f.f_code.co_filename, "line": f.f_lineno})
        f = f.f_back
    inside = [i for i, fr in enumerate(frames) if any(m in fr["filename"] for m in _MACHINERY)]
    return frames[inside[-1] + 1 :] if inside else frames


class StepRecorder:
    """Builds a snapshot of a simulated step from the storages a tracker sees appear and disappear.

    Storages seen before start() are blocks without a trace event, as in a real snapshot. Addresses come from a best-fit
    allocator over one segment that splits a free range only when the remainder is over 1 MiB (as the caching allocator
    does), so analyse() replays every block at its size here. time_us counts the simulated operators."""

    def __init__(self):
        self.held = {}  # key -> (address, bytes requested, frames)
        self.gaps = []  # sorted (size, address) of the free ranges below `top`
        self.gap_at = {}  # free range start -> end
        self.gap_to = {}  # free range end -> start
        self.top = self.high = _BASE
        self.events = []
        self.recording = False
        self.clock = 0

    def start(self):
        self.recording = True

    def stop(self):
        self.recording = False

    def alloc(self, key, nbytes: int):
        if nbytes <= 0 or key in self.held:
            return
        size = cuda_block_bytes(nbytes)
        addr = self._place(size)
        frames = python_stack(3) if self.recording else []
        self.held[key] = (addr, nbytes, frames)
        if self.recording:
            self._event("alloc", addr, nbytes, frames)

    def hold(self, key, nbytes: int):
        """A block held since before recording began, above every address the step used.

        Memory the simulation does not see (cuBLAS's workspaces, DDP's buckets), as a real snapshot shows it."""
        addr = self.high + 2 * SMALL  # a free range too large to be absorbed by the step's last block
        self.held[key] = (addr, nbytes, [])
        self.high = self.top = addr + cuda_block_bytes(nbytes)

    def free(self, key):
        if key not in self.held:
            return
        addr, nbytes, _ = self.held.pop(key)
        if self.recording:
            frames = python_stack(3)
            self._event("free_requested", addr, nbytes, frames)
            self._event("free_completed", addr, nbytes, frames)
        self._release(addr, cuda_block_bytes(nbytes))

    def _event(self, action, addr, nbytes, frames):
        self.events.append(
            {"action": action, "addr": addr, "size": nbytes, "stream": 0, "time_us": self.clock, "frames": frames}
        )

    def _place(self, size: int) -> int:
        i = bisect.bisect_left(self.gaps, (size, 0))
        exact = i < len(self.gaps) and self.gaps[i][0] == size
        if not exact:  # else the smallest range whose remainder the allocator would split off
            i = bisect.bisect_left(self.gaps, (size + SMALL + 1, 0))
        if i < len(self.gaps):
            gap, addr = self.gaps.pop(i)
            end = self.gap_at.pop(addr)
            del self.gap_to[end]
            if gap > size:
                self._add_gap(addr + size, end)
            return addr
        addr = self.top
        self.top += size
        self.high = max(self.high, self.top)
        return addr

    def _release(self, addr: int, size: int):
        lo, hi = addr, addr + size
        if lo in self.gap_to:  # merge with the free range before
            lo = self.gap_to.pop(lo)
            self.gaps.remove((self.gap_at.pop(lo) - lo, lo))
        if hi in self.gap_at:  # and the one after
            end = self.gap_at.pop(hi)
            del self.gap_to[end]
            self.gaps.remove((end - hi, hi))
            hi = end
        if hi == self.top:
            self.top = lo
        else:
            self._add_gap(lo, hi)

    def _add_gap(self, lo: int, hi: int):
        bisect.insort(self.gaps, (hi - lo, lo))
        self.gap_at[lo], self.gap_to[hi] = hi, lo

    def snapshot(self) -> dict:
        """The recorded step as torch.cuda.memory._snapshot() would return it.

        One segment (with room after the highest block so that its last range splits too) and the trace of device 0."""
        end = self.high + 2 * SMALL
        blocks, cursor = [], _BASE
        for addr, nbytes, frames in sorted(self.held.values()):
            if addr > cursor:
                blocks.append(_block(cursor, addr - cursor, 0, "inactive", []))
            blocks.append(_block(addr, cuda_block_bytes(nbytes), nbytes, "active_allocated", frames))
            cursor = addr + cuda_block_bytes(nbytes)
        blocks.append(_block(cursor, end - cursor, 0, "inactive", []))
        active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segment = {
            "device": 0,
            "address": _BASE,
            "total_size": end - _BASE,
            "allocated_size": active,
            "active_size": active,
            "requested_size": sum(b["requested_size"] for b in blocks),
            "stream": 0,
            "segment_type": "large",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": [],
            "blocks": blocks,
        }
        return {"segments": [segment], "device_traces": [self.events]}


def _block(addr, size, requested, state, frames) -> dict:
    return {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": frames}

"""PyTorch's MemTracker with a memory-over-time curve: the CPU's measurement of one training step's memory.

A module of its own, imported only where memory is measured: importing MemTracker imports Dynamo and Inductor, about
1.3 s on the 2-core EPYC (`python -X importtime`), which a run that measures no memory (a time-to-loss run) should
not pay.
"""

from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker


class TimelineMemTracker(MemTracker):
    """PyTorch's MemTracker that also records the total after every op, for a memory-over-time curve.

    It counts live tensor storage by category, as the dispatcher sees it (on the CPU within ~0.1 MiB of the allocator
    for eager code), and under FakeTensorMode without allocating."""

    def __init__(self):
        super().__init__()
        self.timeline: list[int] = []

    def _pre_fw_hook(self, module, inputs):
        # The root's second forward in one tracked step is the next micro-batch (gradient accumulation).
        # MemTracker keeps per-module statistics for a single call and refuses a second; only the running
        # totals are used here, so the per-module statistics start afresh.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                self.reset_mod_stats()
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state) -> None:
        # Only the global peak is read (memory_breakdown). MemTracker also updates the peak of every active
        # module after every op, O(modules) per op: it made a tracked step of the cpu profile's 36-layer
        # model 4x slower than an untracked one, and the planner's estimates take minutes.
        for dev, snap in self._curr_mem_snap.items():
            if snap[_TOTAL_KEY] > self._peak_mem.get(dev, 0):
                self._peak_mem[dev] = snap[_TOTAL_KEY]
                self._peak_mem_snap[dev] = dict(snap)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        res = super().__torch_dispatch__(func, types, args, kwargs)
        self.timeline.append(sum(snap[_TOTAL_KEY] for snap in self._curr_mem_snap.values()))
        return res
